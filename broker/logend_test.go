package broker

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/switchyard-ai/switchyard/internal/testwait"
	"github.com/switchyard-ai/switchyard/subjects"
	"github.com/switchyard-ai/switchyard/wire"
)

// The line that ends a migrated request names every agent it ran on, in
// attempt order, not only the last.
func TestLogEndNamesEveryAgent(t *testing.T) {
	var logs testwait.Buffer
	r := newRig(t, Config{StallTimeout: 5 * time.Second}, WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	r.agent("first", subjects.PoolRegular, "", 1, func(a *fakeAgent, job *wire.Job, say func(*wire.Chunk)) {
		say(&wire.Chunk{Kind: wire.Chunk_KIND_ACCEPTED})
		say(token(" a"))
		lost := token(" lost")
		lost.Seq = 3 // seq 2 never arrives: the stream migrates
		say(lost)
		a.state.Store(wire.StateDraining)
	})
	r.waitEligible("first")
	c := submit(t, r.b)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := c.Next(ctx); err != nil { // accepted by the first agent
		t.Fatal(err)
	}
	r.agent("second", subjects.PoolRegular, "", 1, func(a *fakeAgent, job *wire.Job, say func(*wire.Chunk)) {
		say(&wire.Chunk{Kind: wire.Chunk_KIND_ACCEPTED})
		say(token(" b"))
		say(final())
	})
	if _, err := readAll(t, c); err != nil {
		t.Fatal(err)
	}
	c.Close()
	var line string
	for l := range strings.SplitSeq(logs.String(), "\n") {
		if strings.Contains(l, "msg=request ") {
			line = l
		}
	}
	if !strings.Contains(line, "agents=first,second ") || !strings.Contains(line, "migrations=1 ") {
		t.Fatalf("request line %q, want agents=first,second and migrations=1", line)
	}
}
