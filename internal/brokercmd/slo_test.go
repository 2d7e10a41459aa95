package brokercmd

import (
	"io"
	"strings"
	"testing"
	"time"
)

func TestSLOFlags(t *testing.T) {
	o, err := parseFlags([]string{"--dispatch-mode", "slo", "--slo-ttft", "2s", "--slo-itl", "20ms", "--pd-threshold", "1024"}, func(string) string { return "" }, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if o.mode != "slo" || o.sloTTFT != 2*time.Second || o.sloITL != 20*time.Millisecond || o.pdThreshold != 1024 {
		t.Fatalf("options %+v", o)
	}
	for _, args := range [][]string{{"--slo-ttft", "-1s"}, {"--slo-itl", "-5ms"}, {"--pd-threshold", "-1"}} {
		if _, err := parseFlags(args, func(string) string { return "" }, io.Discard); err == nil || !strings.Contains(err.Error(), "negative") {
			t.Errorf("%v: err %v, want one saying negative", args, err)
		}
	}
}
