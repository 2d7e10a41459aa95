package wire

import (
	"encoding/binary"
	"errors"
	"fmt"

	"google.golang.org/protobuf/proto"
)

// A reply message carries the chunks of one or more attempts, possibly of
// several requests, that one agent sends to one broker: FrameMarker, then
// per chunk its encoded length (uvarint) and its protobuf encoding. An agent
// gathers the chunks that are ready at the same moment into one message, so
// the per-message costs of NATS (the server's parse and routing, the
// broker's read and wake-up) are paid once per batch, not per chunk.
//
// A message that does not start with FrameMarker is refused.
const FrameMarker byte = 0

// MaxFrameBatch is the size beyond which an agent starts a new message
// rather than adding frames to the current one (well under NATS's default
// max_payload of 1 MiB).
const MaxFrameBatch = 256 << 10

// ErrBadFrame reports a reply message whose framing is broken.
var ErrBadFrame = errors.New("wire: bad chunk frame")

// AppendFrame appends c as one frame to buf. Start a message with
// FrameMarker before its first frame.
func AppendFrame(buf []byte, c *Chunk) ([]byte, error) {
	n := proto.Size(c)
	buf = binary.AppendUvarint(buf, uint64(n))
	start := len(buf)
	buf, err := proto.MarshalOptions{UseCachedSize: true}.MarshalAppend(buf, c)
	if err != nil {
		return buf[:start], err
	}
	if len(buf)-start != n {
		return buf[:start], fmt.Errorf("%w: chunk changed while encoded", ErrBadFrame)
	}
	return buf, nil
}

// AppendEncodedFrame appends enc, a chunk already encoded, to buf as one
// frame.
func AppendEncodedFrame(buf, enc []byte) []byte {
	buf = binary.AppendUvarint(buf, uint64(len(enc)))
	return append(buf, enc...)
}

// Frames calls fn with the encoding of each chunk of a reply message, in
// order. It stops at the first error of fn, or at broken framing
// (ErrBadFrame: no FrameMarker, a length beyond the end), after the frames
// before it were handed out.
func Frames(data []byte, fn func(chunk []byte) error) error {
	if len(data) == 0 || data[0] != FrameMarker {
		return fmt.Errorf("%w: no frame marker", ErrBadFrame)
	}
	data = data[1:]
	for len(data) > 0 {
		n, k := binary.Uvarint(data)
		if k <= 0 || n > uint64(len(data)-k) {
			return fmt.Errorf("%w: frame length at %d bytes from the end", ErrBadFrame, len(data))
		}
		if err := fn(data[k : k+int(n)]); err != nil {
			return err
		}
		data = data[k+int(n):]
	}
	return nil
}
