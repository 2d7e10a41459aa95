package batch

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/switchyard-ai/switchyard/internal/natstest"
)

// FuzzObjectsAsNATSGo holds the store's own object writer and reader (which
// bound what they hold in flight, where nats.go's Put and Get do not) to
// nats.go's Object Store: an object either side writes, the other reads
// back byte for byte, with the same size, chunk count and digest. Sizes
// reach past several chunks, so chunk boundaries and a last short chunk
// are covered.
func FuzzObjectsAsNATSGo(f *testing.F) {
	srv := natstest.RunJetStream(f)
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		f.Fatal(err)
	}
	s := NewStore(js, Config{}, slog.New(slog.DiscardHandler))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	f.Cleanup(cancel)
	obj, _, err := s.buckets(ctx)
	if err != nil {
		f.Fatal(err)
	}

	for _, seed := range []struct {
		pattern []byte
		size    uint32
	}{
		{nil, 0},
		{[]byte("a"), 1},
		{[]byte(`{"custom_id":"x"}` + "\n"), chunkSize},
		{[]byte("0123456789"), chunkSize + 1},
		{[]byte{0, 255, 10}, 3*chunkSize - 7},
	} {
		f.Add(seed.pattern, seed.size)
	}
	f.Fuzz(func(t *testing.T, pattern []byte, size uint32) {
		if len(pattern) == 0 {
			pattern = []byte{0}
		}
		n := int(size % (3*chunkSize + 2))
		data := bytes.Repeat(pattern, n/len(pattern)+1)[:n]

		// Written by the store, read by nats.go.
		mine, err := s.putObject(ctx, jetstream.ObjectMeta{Name: "mine"}, bytes.NewReader(data))
		if err != nil {
			t.Fatal(err)
		}
		theirs, err := obj.GetInfo(ctx, "mine")
		if err != nil {
			t.Fatal(err)
		}
		if theirs.Size != uint64(n) || theirs.Chunks != mine.Chunks || theirs.Digest != mine.Digest || theirs.NUID != mine.NUID {
			t.Fatalf("nats.go reads the store's object as size %d, %d chunks, digest %s, nuid %s; the store wrote %d, %d, %s, %s",
				theirs.Size, theirs.Chunks, theirs.Digest, theirs.NUID, n, mine.Chunks, mine.Digest, mine.NUID)
		}
		got, err := obj.GetBytes(ctx, "mine")
		if err != nil {
			t.Fatalf("nats.go reading the store's object: %v", err)
		}
		if !bytes.Equal(got, data) {
			t.Fatalf("nats.go read %d bytes of the store's object, want the %d written", len(got), n)
		}

		// Written by nats.go, read by the store.
		info, err := obj.PutBytes(ctx, "theirs", data)
		if err != nil {
			t.Fatal(err)
		}
		r, err := s.openObject(ctx, info)
		if err != nil {
			t.Fatal(err)
		}
		got, err = io.ReadAll(r)
		r.Close()
		if err != nil {
			t.Fatalf("the store reading nats.go's object: %v", err)
		}
		if !bytes.Equal(got, data) {
			t.Fatalf("the store read %d bytes of nats.go's object, want the %d written", len(got), n)
		}

		for _, name := range []string{"mine", "theirs"} {
			if err := obj.Delete(ctx, name); err != nil {
				t.Fatal(err)
			}
		}
	})
}
