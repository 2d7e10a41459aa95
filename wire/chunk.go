package wire

import "google.golang.org/protobuf/proto"

// DecodeChunk decodes the protobuf encoding of a Chunk into c, replacing
// whatever c held, so that c may come from a pool: proto.Unmarshal, with
// unknown fields dropped. The chunk's strings and bytes are its own, valid
// whatever becomes of data. It is the broker's decoder for the chunks it
// relays.
func DecodeChunk(data []byte, c *Chunk) error {
	return proto.UnmarshalOptions{DiscardUnknown: true}.Unmarshal(data, c)
}

// AppendChunk appends the protobuf encoding of c to buf, as
// proto.MarshalAppend does (and refuses what it refuses: a string that is
// not UTF-8). It is the agent's encoder for the chunks it sends.
func AppendChunk(buf []byte, c *Chunk) ([]byte, error) {
	return proto.MarshalOptions{}.MarshalAppend(buf, c)
}
