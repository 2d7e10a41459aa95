package brokercmd

import (
	"io"
	"strings"
	"testing"
	"time"
)

func TestSLOFlags(t *testing.T) {
	o, err := parseFlags([]string{"--dispatch-mode", "slo", "--slo-ttft", "2s", "--slo-itl", "20ms", "--pd-threshold", "1024", "--slo-probe-share", "0.1", "--slo-probe-age", "5s"}, func(string) string { return "" }, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if o.mode != "slo" || o.sloTTFT != 2*time.Second || o.sloITL != 20*time.Millisecond || o.pdThreshold != 1024 ||
		o.probeShare != 0.1 || o.probeAge != 5*time.Second {
		t.Fatalf("options %+v", o)
	}
	for _, args := range [][]string{{"--slo-ttft", "-1s"}, {"--slo-itl", "-5ms"}, {"--pd-threshold", "-1"}} {
		if _, err := parseFlags(args, func(string) string { return "" }, io.Discard); err == nil || !strings.Contains(err.Error(), "negative") {
			t.Errorf("%v: err %v, want one saying negative", args, err)
		}
	}
	for _, args := range [][]string{{"--slo-probe-share", "1.5"}, {"--slo-probe-share", "-0.1"}, {"--slo-probe-share", "NaN"}, {"--slo-probe-age", "-1s"}} {
		if _, err := parseFlags(args, func(string) string { return "" }, io.Discard); err == nil || !strings.Contains(err.Error(), "--slo-probe") {
			t.Errorf("%v: err %v, want one naming the probe flags", args, err)
		}
	}
}
