package broker

import (
	"slices"
	"testing"
	"time"

	"github.com/switchyard-ai/switchyard/dispatch"
)

func TestLearnRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		name  string
		agent string
		keys  []uint64
	}{
		{"one key", "a1", []uint64{42}},
		{"many keys", "node-7_x", []uint64{1, 1 << 63, 0, 99}},
		{"no keys", "a", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			id, keys, ok := decodeLearn(encodeLearn(tc.agent, tc.keys))
			if !ok || id != tc.agent || !slices.Equal(keys, append([]uint64{}, tc.keys...)) {
				t.Fatalf("decodeLearn = %q %v %v", id, keys, ok)
			}
		})
	}
	for _, bad := range [][]byte{nil, {5, 'a'}, {1, 'a', 1, 2}, {0}} {
		if _, _, ok := decodeLearn(bad); ok {
			t.Errorf("decodeLearn(%v) accepted", bad)
		}
	}
}

func TestAffinityConfig(t *testing.T) {
	var c AffinityConfig
	c.setDefaults()
	if c.Mode != DefaultAffinity || c.Wait != DefaultAffinityWait || c.Queue != DefaultAffinityQueue || c.BlockSize != 16 {
		t.Fatalf("defaults = %+v", c)
	}
	c = AffinityConfig{Queue: -1}
	c.setDefaults()
	if c.Queue != 0 {
		t.Fatalf("negative queue = %d, want 0 (only free slots)", c.Queue)
	}
	if err := (AffinityConfig{Wait: -time.Second}).Validate(); err == nil {
		t.Fatal("negative wait accepted")
	}
	for _, s := range []string{"off", "approx", "precise"} {
		m, err := ParseAffinityMode(s)
		if err != nil || m.String() != s {
			t.Fatalf("ParseAffinityMode(%q) = %v, %v", s, m, err)
		}
	}
	if _, err := ParseAffinityMode("default"); err == nil {
		t.Fatal("default accepted as a flag value")
	}
}

func TestKeepInTree(t *testing.T) {
	now := time.Now()
	agents := []dispatch.AgentView{
		{Agent: dispatch.Agent{ID: "ready"}, Eligible: true},
		{Agent: dispatch.Agent{ID: "blip", LastSeen: now.Add(-time.Second)}, Reason: dispatch.ReasonStale},
		{Agent: dispatch.Agent{ID: "dead", LastSeen: now.Add(-time.Minute)}, Reason: dispatch.ReasonStale},
		{Agent: dispatch.Agent{ID: "draining"}, Reason: dispatch.ReasonDraining},
		{Agent: dispatch.Agent{ID: "warming"}, Reason: dispatch.ReasonWarming},
	}
	for id, want := range map[string]bool{"ready": true, "blip": true, "dead": false, "draining": false, "warming": false, "gone": false} {
		if got := keepInTree(agents, id, now); got != want {
			t.Errorf("keepInTree(%s) = %v, want %v", id, got, want)
		}
	}
}
