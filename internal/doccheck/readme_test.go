package doccheck

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/switchyard-ai/switchyard/wire"
)

const readme = "../../README.md"

// fenced returns the first fenced block of lang after the line starting
// with after.
func fenced(t *testing.T, doc, after, lang string) string {
	t.Helper()
	i := strings.Index(doc, "\n"+after)
	if i < 0 {
		t.Fatalf("%s: no paragraph starting %q", readme, after)
	}
	rest := doc[i:]
	open := "\n```" + lang + "\n"
	j := strings.Index(rest, open)
	if j < 0 {
		t.Fatalf("%s: no ```%s block after %q", readme, lang, after)
	}
	body := rest[j+len(open):]
	k := strings.Index(body, "\n```")
	if k < 0 {
		t.Fatalf("%s: unterminated ```%s block after %q", readme, lang, after)
	}
	return body[:k+1]
}

func readReadme(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(readme)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestReadmeGoClient compiles the README's Go client as a user's program
// would: a module of its own that requires this one through a replace
// directive, as the README says.
func TestReadmeGoClient(t *testing.T) {
	if testing.Short() {
		t.Skip("type-checks a program with its dependencies")
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skipf("no go command: %v", err)
	}
	src := fenced(t, readReadme(t), "From Go, with the generated client", "go")
	if !strings.HasPrefix(src, "package main\n") {
		t.Fatalf("README Go client is not a complete program:\n%s", src)
	}
	repo, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	gomod := "module example.com/client\n\ngo 1.26\n\n" +
		"require github.com/switchyard-ai/switchyard v0.0.0-00010101000000-000000000000\n\n" +
		"replace github.com/switchyard-ai/switchyard => " + repo + "\n"
	if err := os.WriteFile(filepath.Join(dir, "go.mod"), []byte(gomod), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "main.go"), []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	// The module's own go.sum covers the client's dependencies.
	sum, err := os.ReadFile(filepath.Join(repo, "go.sum"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "go.sum"), sum, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"mod", "tidy"}, {"vet", "."}} {
		cmd := exec.Command(goBin, args...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "GOFLAGS=-mod=mod", "GOWORK=off")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("go %s of the README's Go client: %v\n%s\n%s", strings.Join(args, " "), err, out, src)
		}
	}
}

// TestReadmeHeartbeat: the README's heartbeat has every field an agent
// publishes, and nothing else, with values the broker's decoder takes.
func TestReadmeHeartbeat(t *testing.T) {
	sample := fenced(t, readReadme(t), "A heartbeat reads", "json")
	var doc map[string]any
	if err := json.Unmarshal([]byte(sample), &doc); err != nil {
		t.Fatalf("README heartbeat: %v\n%s", err, sample)
	}
	// Strict: an unknown or mistyped field fails here, where agents'
	// decoder would skip it.
	if err := protojson.Unmarshal([]byte(sample), new(wire.Heartbeat)); err != nil {
		t.Errorf("README heartbeat does not decode as wire.Heartbeat: %v", err)
	}

	// A heartbeat as an agent whose engine reports all its figures sends it.
	u := func(v uint32) *uint32 { return &v }
	f := func(v float64) *float64 { return &v }
	real, err := wire.MarshalHeartbeat(&wire.Heartbeat{
		AgentId: "a1", Model: "m", Pool: "regular", State: wire.StateReady,
		EngineRunning: u(1), EngineWaiting: u(0), KvCacheUsage: f(0.5),
		PrefixCacheQueries: f(10), PrefixCacheHits: f(5),
		ReadySince: timestamppb.Now(), SentAt: timestamppb.Now(), Interval: durationpb.New(time.Second),
	})
	if err != nil {
		t.Fatal(err)
	}
	var want map[string]any
	if err := json.Unmarshal(real, &want); err != nil {
		t.Fatal(err)
	}
	keys := func(m map[string]any) []string {
		out := make([]string, 0, len(m))
		for k := range m {
			out = append(out, k)
		}
		slices.Sort(out)
		return out
	}
	for _, k := range keys(want) {
		if _, ok := doc[k]; !ok {
			t.Errorf("README heartbeat lacks %q", k)
		}
	}
	for _, k := range keys(doc) {
		if _, ok := want[k]; !ok {
			t.Errorf("README heartbeat has %q, which agents do not send", k)
		}
	}
}
