package agentcmd

import (
	"bytes"
	"context"
	"io"
	"strings"
	"testing"
)

func noEnv(string) string { return "" }

// TestFlagsRefused: bad values of the rollout flags stop the command before
// it connects anywhere, naming the flag.
func TestFlagsRefused(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"label without value", []string{"--role", "decode", "--pd-labels", "kv="}, "--pd-labels"},
		{"label twice", []string{"--role", "prefill", "--pd-labels", "kv=a,kv=b"}, "--pd-labels"},
		{"floor above one", []string{"--slow-start-floor", "2"}, "--slow-start-floor"},
		{"negative ramp", []string{"--slow-start", "-1s"}, "--slow-start -1s"},
		{"negative keep-alive", []string{"--keepalive", "-1s"}, "--keepalive"},
		{"no kv hold", []string{"--kv-hold", "0s"}, "--kv-hold"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := Run(context.Background(), append([]string{"--engine", "sim", "--nats-url", "nats://127.0.0.1:1"}, tc.args...), noEnv, io.Discard, io.Discard)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Run(%v) = %v, want an error naming %s", tc.args, err, tc.want)
			}
		})
	}
}

// TestUsageListsRolloutFlags: -h documents the flags the broker side
// relies on.
func TestUsageListsRolloutFlags(t *testing.T) {
	var stderr bytes.Buffer
	if err := Run(context.Background(), []string{"-h"}, noEnv, io.Discard, &stderr); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"--pd-labels", "--kv-hold", "--slow-start", "--slow-start-floor", "--keepalive"} {
		if !strings.Contains(stderr.String(), "  "+f+" ") {
			t.Errorf("usage lacks %s", f)
		}
	}
}
