package batch

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"hash"
	"io"

	"github.com/nats-io/nats.go/jetstream"
)

// readAhead is how many chunks an object reader fetches ahead of its
// reader: what it holds is this many chunks (128 KiB each by default).
const readAhead = 4

// objectReader reads an object's chunks with a pull consumer that fetches
// at most readAhead chunks ahead, so a reader that is slow (a client
// downloading) holds back the server instead of the broker buffering the
// object. nats.go's ObjectStore.Get pushes chunks into a subscription,
// which buffers whatever its reader has not taken yet.
type objectReader struct {
	it      jetstream.MessagesContext
	left    uint32 // chunks not yet read
	buf     []byte
	digest  hash.Hash
	want    string // the object's digest, "SHA-256=<base64url>"
	stopped bool
}

// openObject returns a reader of the object info describes.
func (s *Store) openObject(ctx context.Context, info *jetstream.ObjectInfo) (io.ReadCloser, error) {
	if info.Chunks == 0 {
		return io.NopCloser(bytes.NewReader(nil)), nil
	}
	cons, err := s.js.OrderedConsumer(ctx, "OBJ_"+FilesBucket, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{"$O." + FilesBucket + ".C." + info.NUID},
	})
	if err != nil {
		return nil, err
	}
	it, err := cons.Messages(jetstream.PullMaxMessages(readAhead))
	if err != nil {
		return nil, err
	}
	return &objectReader{it: it, left: info.Chunks, digest: sha256.New(), want: info.Digest}, nil
}

func (r *objectReader) Read(p []byte) (int, error) {
	for len(r.buf) == 0 {
		if r.left == 0 {
			if got := "SHA-256=" + base64.URLEncoding.EncodeToString(r.digest.Sum(nil)); r.want != "" && got != r.want {
				return 0, fmt.Errorf("object digest %s, want %s", got, r.want)
			}
			return 0, io.EOF
		}
		m, err := r.it.Next()
		if err != nil {
			if errors.Is(err, jetstream.ErrMsgIteratorClosed) {
				return 0, io.ErrClosedPipe
			}
			return 0, err
		}
		r.left--
		r.buf = m.Data()
		r.digest.Write(r.buf)
	}
	n := copy(p, r.buf)
	r.buf = r.buf[n:]
	return n, nil
}

func (r *objectReader) Close() error {
	if !r.stopped {
		r.stopped = true
		r.it.Stop()
	}
	return nil
}
