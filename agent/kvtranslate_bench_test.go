package agent

import (
	"encoding/json"
	"fmt"
	"testing"

	"github.com/switchyard-ai/switchyard/oaiformat"
)

// BenchmarkKVTranslateLearn is the agent's own cost per prompt with
// --kv-events-hash vllm, the engine's tokenizing aside: decoding the
// /tokenize answer, its token strings to text, aligning it with the
// broker's view and recording the prompt's prefixes.
func BenchmarkKVTranslateLearn(b *testing.B) {
	for _, n := range []int{500, 4000} {
		b.Run(fmt.Sprintf("words=%d", n), func(b *testing.B) {
			v := newVLLMLike(16)
			msgs := conversation("bench", n, "what is the answer to this question")
			resp := v.tokenize(b, msgs)
			raw, _ := json.Marshal(resp)
			tr, _ := newTestTranslator(DefaultKVTranslateBlocks, DefaultKVTranslatePrefixes)
			p := oaiformat.Prompt{Chat: true, Messages: msgs}
			b.SetBytes(int64(len(msgs[0].Content)))
			b.ReportAllocs()
			for b.Loop() {
				var r oaiformat.TokenizeResponse
				if err := json.Unmarshal(raw, &r); err != nil {
					b.Fatal(err)
				}
				pt := promptTokens{Prompt: p, IDs: r.Tokens}
				pt.Text, pt.Ends = oaiformat.TokenText(nil, make([]int, 0, len(r.TokenStrs)), r.TokenStrs)
				plan, _ := planPrompt(&pt, tr.blockSize, tr.keyBlock)
				tr.mu.Lock()
				tr.learn(plan)
				tr.mu.Unlock()
			}
			b.ReportMetric(float64(len(resp.Tokens)), "tokens/prompt")
		})
	}
}
