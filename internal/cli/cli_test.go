package cli

import (
	"flag"
	"testing"
)

func TestApplyEnv(t *testing.T) {
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	url := fs.String("nats-url", "", "")
	slots := fs.Int("slots", 1, "")
	if err := fs.Parse([]string{"--slots", "4"}); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"SWITCHYARD_NATS_URL": "nats://x:1", "SWITCHYARD_SLOTS": "9"}
	if err := ApplyEnv(fs, func(k string) string { return env[k] }); err != nil {
		t.Fatal(err)
	}
	if *url != "nats://x:1" || *slots != 4 {
		t.Fatalf("url %q slots %d: env must fill unset flags only", *url, *slots)
	}
	env["SWITCHYARD_SLOTS"] = "x"
	fs2 := flag.NewFlagSet("y", flag.ContinueOnError)
	fs2.Int("slots", 1, "")
	if err := ApplyEnv(fs2, func(k string) string { return env[k] }); err == nil {
		t.Fatal("bad env value accepted")
	}
}

func TestHostPort(t *testing.T) {
	for _, tc := range []struct {
		name, in string
		host     string
		port     int
		ok       bool
	}{
		{"fixed", "127.0.0.1:4222", "127.0.0.1", 4222, true},
		{"random", "127.0.0.1:0", "127.0.0.1", -1, true},
		{"no port", "127.0.0.1", "", 0, false},
		{"bad port", "h:x", "", 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, p, err := HostPort(tc.in)
			if (err == nil) != tc.ok || h != tc.host || p != tc.port {
				t.Fatalf("HostPort(%q) = %q, %d, %v", tc.in, h, p, err)
			}
		})
	}
}
