package wire

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"
)

var update = flag.Bool("update", false, "rewrite golden files")

func goldenHeartbeat() *Heartbeat {
	at := time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)
	return &Heartbeat{
		AgentId:       "gpu-node-1",
		Model:         "meta-llama/Llama-3.1-8B",
		Pool:          "regular",
		Engine:        "openai",
		Transport:     "http",
		State:         StateReady,
		Slots:         8,
		Active:        3,
		EngineRunning: proto.Uint32(3),
		EngineWaiting: proto.Uint32(0),
		KvCacheUsage:  proto.Float64(0.25),
		ReadySince:    timestamppb.New(at.Add(-time.Minute)),
		Interval:      durationpb.New(time.Second),
		Seq:           42,
		Version:       "v0.1.0",
		SentAt:        timestamppb.New(at),
	}
}

// compare checks got against testdata/name, after compacting both: protojson
// randomises insignificant whitespace on purpose.
func compare(t *testing.T, name string, got []byte) {
	t.Helper()
	var pretty bytes.Buffer
	if err := json.Indent(&pretty, got, "", "  "); err != nil {
		t.Fatal(err)
	}
	pretty.WriteByte('\n')
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.WriteFile(path, pretty.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var a, b bytes.Buffer
	if err := json.Compact(&a, pretty.Bytes()); err != nil {
		t.Fatal(err)
	}
	if err := json.Compact(&b, want); err != nil {
		t.Fatal(err)
	}
	if a.String() != b.String() {
		t.Fatalf("%s differs (run with -update to accept):\ngot:  %s\nwant: %s", name, a.String(), b.String())
	}
}

func TestHeartbeatJSONGolden(t *testing.T) {
	data, err := MarshalHeartbeat(goldenHeartbeat())
	if err != nil {
		t.Fatal(err)
	}
	compare(t, "heartbeat.json", data)
	back, err := UnmarshalHeartbeat(data)
	if err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(back, goldenHeartbeat()) {
		t.Fatalf("round trip changed heartbeat: %v", back)
	}
}

func TestHeartbeatUnknownLoad(t *testing.T) {
	hb := goldenHeartbeat()
	hb.EngineRunning, hb.EngineWaiting, hb.KvCacheUsage = nil, nil, nil
	data, err := MarshalHeartbeat(hb)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(data, &m); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"engine_running", "engine_waiting", "kv_cache_usage"} {
		if _, ok := m[k]; ok {
			t.Errorf("%s present although unknown", k)
		}
	}
	for _, k := range []string{"agent_id", "model", "pool", "state", "slots", "active", "ready_since", "interval", "seq", "version"} {
		if _, ok := m[k]; !ok {
			t.Errorf("%s missing", k)
		}
	}
}

func TestHeartbeatForwardCompatible(t *testing.T) {
	hb, err := UnmarshalHeartbeat([]byte(`{"agent_id":"a","future_field":{"x":1},"slots":4}`))
	if err != nil {
		t.Fatal(err)
	}
	if hb.GetAgentId() != "a" || hb.GetSlots() != 4 {
		t.Fatalf("got %v", hb)
	}
	if _, err := UnmarshalHeartbeat([]byte(`{"slots":"many"}`)); err == nil {
		t.Fatal("bad slots accepted")
	}
}

func TestErrorIs(t *testing.T) {
	err := fmt.Errorf("attempt 1: %w", &Error{Code: CodeEngine, Message: "boom"})
	if !errors.Is(err, &Error{Code: CodeEngine}) {
		t.Fatal("code did not match")
	}
	if errors.Is(err, &Error{Code: CodeCancelled}) {
		t.Fatal("other code matched")
	}
}

func TestEngineText(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"  plain message \n", "plain message"},
		{"line one\nline two\r\tend", "line one line two  end"},
		{"bad \xff byte", "bad \uFFFD byte"},
		{"\x1b[31mred\x1b[0m", " [31mred [0m"},
	} {
		if got := EngineText(tc.in); got != tc.want {
			t.Errorf("EngineText(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
	long := EngineText(strings.Repeat("é", 64<<10))
	if len(long) > MaxEngineText+3 || !strings.HasSuffix(long, "...") || !utf8.ValidString(long) {
		t.Errorf("a 128 KiB message: %d bytes, %q...", len(long), long[:16])
	}
}
