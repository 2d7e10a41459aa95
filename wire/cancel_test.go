package wire

import (
	"math"
	"testing"
)

func TestCancelRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		name    string
		attempt uint32
		agent   string
		want    string
	}{
		{"every agent", 3, "", "3"},
		{"one agent", 0, "agent-7", "0 agent-7"},
		{"largest attempt", math.MaxUint32, "a", "4294967295 a"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			data := AppendCancel(nil, tc.attempt, tc.agent)
			if string(data) != tc.want {
				t.Fatalf("AppendCancel = %q, want %q", data, tc.want)
			}
			upTo, agent, err := ParseCancel(data)
			if err != nil || upTo != tc.attempt || agent != tc.agent {
				t.Fatalf("ParseCancel(%q) = %d %q %v", data, upTo, agent, err)
			}
		})
	}
	if upTo, agent, err := ParseCancel(nil); err != nil || upTo != math.MaxUint32 || agent != "" {
		t.Fatalf("ParseCancel(empty) = %d %q %v, want every attempt at every agent", upTo, agent, err)
	}
	for _, bad := range []string{"x", "3 ", " a", "-1", "4294967296"} {
		if _, _, err := ParseCancel([]byte(bad)); err == nil {
			t.Errorf("ParseCancel(%q) accepted", bad)
		}
	}
}
