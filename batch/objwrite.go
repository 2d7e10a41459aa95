package batch

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Object Store layout, as nats.go's ObjectStore reads it.
const (
	chunkSize = 128 << 10
	// writeAhead bounds the chunks published and not yet stored: an upload
	// goes at the pace the servers store it.
	writeAhead = 16
)

// putObject stores r as object name in the files bucket, in the Object
// Store's own layout (chunks on $O.<bucket>.C.<nuid>, then the info on
// $O.<bucket>.M.<name> as a rollup), with at most writeAhead chunks
// unacknowledged. nats.go's ObjectStore.Put publishes without waiting for
// acknowledgements, up to thousands of chunks ahead, and gives up ("stalled
// with too many outstanding async published messages") when the servers
// store more slowly than the client sends: a large upload to a disk-backed
// server fails. A replaced object's old chunks are purged once the new
// info is stored.
func (s *Store) putObject(ctx context.Context, meta jetstream.ObjectMeta, r io.Reader) (*jetstream.ObjectInfo, error) {
	obj, _, err := s.buckets(ctx)
	if err != nil {
		return nil, err
	}
	old, err := obj.GetInfo(ctx, meta.Name, jetstream.GetObjectInfoShowDeleted())
	if err != nil && !errors.Is(err, jetstream.ErrObjectNotFound) {
		return nil, err
	}
	id := newID("")
	chunkSubj := "$O." + FilesBucket + ".C." + id
	purge := func() {
		pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		if st, err := s.js.Stream(pctx, "OBJ_"+FilesBucket); err == nil {
			_ = st.Purge(pctx, jetstream.WithPurgeSubject(chunkSubj))
		}
	}
	var window []jetstream.PubAckFuture
	wait := func(f jetstream.PubAckFuture) error {
		select {
		case <-f.Ok():
			return nil
		case err := <-f.Err():
			return err
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	h := sha256.New()
	var size uint64
	var chunks uint32
	for {
		buf := make([]byte, chunkSize)
		n, rerr := io.ReadFull(r, buf)
		if n > 0 {
			h.Write(buf[:n])
			m := nats.NewMsg(chunkSubj)
			m.Data = buf[:n]
			f, err := s.js.PublishMsgAsync(m)
			if err != nil {
				purge()
				return nil, err
			}
			window = append(window, f)
			size += uint64(n)
			chunks++
			if len(window) >= writeAhead {
				if err := wait(window[0]); err != nil {
					purge()
					return nil, err
				}
				window = window[1:]
			}
		}
		if rerr == io.EOF || rerr == io.ErrUnexpectedEOF {
			break
		}
		if rerr != nil {
			purge()
			return nil, rerr
		}
	}
	for _, f := range window {
		if err := wait(f); err != nil {
			purge()
			return nil, err
		}
	}
	meta.Opts = &jetstream.ObjectMetaOptions{ChunkSize: chunkSize}
	info := &jetstream.ObjectInfo{
		ObjectMeta: meta, Bucket: FilesBucket, NUID: id, Size: size, Chunks: chunks,
		ModTime: time.Now().UTC(), Digest: "SHA-256=" + base64.URLEncoding.EncodeToString(h.Sum(nil)),
	}
	mm := nats.NewMsg("$O." + FilesBucket + ".M." + base64.URLEncoding.EncodeToString([]byte(meta.Name)))
	mm.Header.Set(jetstream.MsgRollup, jetstream.MsgRollupSubject)
	mm.Data, _ = json.Marshal(info)
	if _, err := s.js.PublishMsg(ctx, mm); err != nil {
		purge()
		return nil, err
	}
	if old != nil && !old.Deleted && old.NUID != "" {
		if st, err := s.js.Stream(ctx, "OBJ_"+FilesBucket); err == nil {
			_ = st.Purge(ctx, jetstream.WithPurgeSubject("$O."+FilesBucket+".C."+old.NUID))
		}
	}
	return info, nil
}
