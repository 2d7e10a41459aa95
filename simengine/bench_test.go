package simengine

import (
	"fmt"
	"testing"
)

// BenchmarkStream measures the engine's own cost per request in fast mode
// (zero TTFT and ITL), which is what a broker benchmark adds on top.
func BenchmarkStream(b *testing.B) {
	for _, n := range []int{16, 256} {
		for _, api := range []API{APIChat, APICompletion} {
			b.Run(fmt.Sprintf("%s/tokens=%d", api, n), func(b *testing.B) {
				e := newTestEngine(b, testConfig())
				var body []byte
				if api == APIChat {
					body = []byte(chatJSON(fmt.Sprintf(`"max_tokens":%d,"stream":true`, n), "user", "the sun"))
				} else {
					body = []byte(completionJSON("the sun", fmt.Sprintf(`"max_tokens":%d,"stream":true`, n)))
				}
				emit := func([]byte) error { return nil }
				b.ReportAllocs()
				for b.Loop() {
					if err := e.Stream(b.Context(), api, body, emit); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
