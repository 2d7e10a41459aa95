package broker

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/switchyard-ai/switchyard/internal/natstest"
	"github.com/switchyard-ai/switchyard/wire"
)

// hopCall returns a broker with one call in flight, as its reply handler
// sees it, and a reply message of n token chunks for it.
func hopCall(tb testing.TB, n int) (*Broker, *Call, *nats.Msg) {
	tb.Helper()
	s := natstest.RunJetStream(tb)
	nc, err := nats.Connect(s.ClientURL())
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(nc.Close)
	b, err := New(nc, Config{ID: "b"})
	if err != nil {
		tb.Fatal(err)
	}
	c := &Call{ID: "b-1x", b: b, ready: make(chan struct{}, 1)}
	c.secret, c.speaker = 42, "a1"
	b.calls.Store(c.ID, c)
	data := []byte{wire.FrameMarker}
	for i := range n {
		ch := token(" word")
		ch.RequestId, ch.AgentId, ch.Seq, ch.Secret = c.ID, "a1", uint64(i), 42
		if data, err = wire.AppendFrame(data, ch); err != nil {
			tb.Fatal(err)
		}
	}
	return b, c, &nats.Msg{Subject: "sy.reply.b.chunks", Data: data}
}

// BenchmarkReplyToken is the broker's hop for token chunks: walk the
// frames of a reply message, decode each chunk, check its secret, attempt
// and sequence, and hand it to its call. chunks=N is one message of N
// chunks (the agent's outbox gathers them); ns/op is per message.
func BenchmarkReplyToken(b *testing.B) {
	for _, n := range []int{1, 8} {
		b.Run("chunks="+itoa(n), func(b *testing.B) {
			br, c, m := hopCall(b, n)
			b.ReportAllocs()
			for b.Loop() {
				c.nextSeq = 0
				br.onReply(m)
				for range n {
					ch, _, _ := c.next()
					br.putChunk(ch) // as the reader's next Next does
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/chunk")
		})
	}
}

func itoa(n int) string {
	if n < 10 {
		return string(rune('0' + n))
	}
	return itoa(n/10) + itoa(n%10)
}

// BenchmarkReplyToReader is the hand-off of a token chunk to a reader
// blocked in Next, as an SSE handler waits between tokens: onReply, the
// reader's wake-up, its select and deliver, then the reader's reply on a
// channel (the same in every build: the benchmark's own ping-pong).
func BenchmarkReplyToReader(b *testing.B) {
	br, c, m := hopCall(b, 1)
	c.Deadline = time.Now().Add(time.Hour)
	read := make(chan struct{})
	go func() {
		defer close(read)
		for {
			if _, err := c.Next(b.Context()); err != nil {
				return
			}
			read <- struct{}{}
		}
	}()
	b.ReportAllocs()
	for b.Loop() {
		c.nextSeq = 0
		br.onReply(m)
		<-read
	}
	c.fail(ErrClosed)
	for range read {
	}
}
