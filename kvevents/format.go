package kvevents

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/vmihailenco/msgpack/v5"
	"github.com/vmihailenco/msgpack/v5/msgpcode"
)

// Kind is an event's type, vLLM's class name on the wire.
type Kind uint8

const (
	// BlockStored: the engine cached blocks (a chain, parent first).
	BlockStored Kind = iota + 1
	// BlockRemoved: the engine evicted blocks.
	BlockRemoved
	// AllBlocksCleared: the engine dropped its whole prefix cache.
	AllBlocksCleared
)

var kindTags = [...]string{BlockStored: "BlockStored", BlockRemoved: "BlockRemoved", AllBlocksCleared: "AllBlocksCleared"}

func (k Kind) String() string {
	if int(k) < len(kindTags) && kindTags[k] != "" {
		return kindTags[k]
	}
	return fmt.Sprintf("Kind(%d)", uint8(k))
}

// MediumGPU is vLLM's medium of device blocks; CPU offloading reports
// "CPU".
const MediumGPU = "GPU"

// Event is one KV-cache event.
type Event struct {
	Kind Kind
	// Hashes are the blocks' hashes, parent first (Stored, Removed).
	Hashes []uint64
	// Parent is the hash of the block before Hashes[0] when HasParent
	// (Stored; a chain from the start of the prompt has none).
	Parent    uint64
	HasParent bool
	// TokenIDs are the stored blocks' tokens, BlockSize per block (Stored).
	TokenIDs  []uint32
	BlockSize int
	// LoraID is the adapter's id, 0 for none.
	LoraID int
	// Medium is where the blocks live ("GPU", "CPU"), "" when unset.
	Medium string
}

// Batch is one published message's payload.
type Batch struct {
	// Time is when the engine made the batch (vLLM's ts, seconds).
	Time   time.Time
	Events []Event
	// DataParallelRank is the engine's data-parallel rank, -1 when unset.
	DataParallelRank int
}

// ErrFormat matches every decoding error.
var ErrFormat = errors.New("kvevents: malformed batch")

// Encode returns b's msgpack payload as vLLM writes it.
func Encode(b Batch) []byte {
	var buf bytes.Buffer
	enc := msgpack.NewEncoder(&buf)
	// Writes to a bytes.Buffer do not fail, so neither do the encoder's.
	n := 2
	if b.DataParallelRank >= 0 {
		n = 3
	}
	_ = enc.EncodeArrayLen(n)
	_ = enc.EncodeFloat64(float64(b.Time.UnixNano()) / 1e9)
	_ = enc.EncodeArrayLen(len(b.Events))
	for _, e := range b.Events {
		encodeEvent(enc, &e)
	}
	if n == 3 {
		_ = enc.EncodeInt(int64(b.DataParallelRank))
	}
	return buf.Bytes()
}

func encodeEvent(enc *msgpack.Encoder, e *Event) {
	hashes := func() {
		_ = enc.EncodeArrayLen(len(e.Hashes))
		for _, h := range e.Hashes {
			_ = enc.EncodeUint(h)
		}
	}
	medium := func() {
		if e.Medium == "" {
			_ = enc.EncodeNil()
		} else {
			_ = enc.EncodeString(e.Medium)
		}
	}
	switch e.Kind {
	case BlockStored:
		_ = enc.EncodeArrayLen(7)
		_ = enc.EncodeString(kindTags[BlockStored])
		hashes()
		if e.HasParent {
			_ = enc.EncodeUint(e.Parent)
		} else {
			_ = enc.EncodeNil()
		}
		_ = enc.EncodeArrayLen(len(e.TokenIDs))
		for _, t := range e.TokenIDs {
			_ = enc.EncodeUint(uint64(t))
		}
		_ = enc.EncodeInt(int64(e.BlockSize))
		if e.LoraID == 0 {
			_ = enc.EncodeNil()
		} else {
			_ = enc.EncodeInt(int64(e.LoraID))
		}
		medium()
	case BlockRemoved:
		_ = enc.EncodeArrayLen(3)
		_ = enc.EncodeString(kindTags[BlockRemoved])
		hashes()
		medium()
	default:
		_ = enc.EncodeArrayLen(1)
		_ = enc.EncodeString(kindTags[AllBlocksCleared])
	}
}

// Decode parses a payload. Unknown event types and fields newer than
// this package are skipped; anything else malformed is an error matching
// [ErrFormat].
func Decode(payload []byte) (Batch, error) {
	d := msgpack.NewDecoder(bytes.NewReader(payload))
	b, err := decodeBatch(d)
	if err != nil {
		return Batch{}, fmt.Errorf("%w: %w", ErrFormat, err)
	}
	return b, nil
}

func decodeBatch(d *msgpack.Decoder) (Batch, error) {
	b := Batch{DataParallelRank: -1}
	n, err := d.DecodeArrayLen()
	if err != nil {
		return b, err
	}
	if n < 2 {
		return b, fmt.Errorf("batch of %d fields", n)
	}
	ts, err := d.DecodeFloat64()
	if err != nil {
		return b, fmt.Errorf("ts: %w", err)
	}
	if math.IsNaN(ts) || math.IsInf(ts, 0) || math.Abs(ts) > 1e11 {
		return b, fmt.Errorf("ts %v out of range", ts)
	}
	sec, frac := math.Modf(ts)
	b.Time = time.Unix(int64(sec), int64(frac*1e9))
	ne, err := d.DecodeArrayLen()
	if err != nil {
		return b, fmt.Errorf("events: %w", err)
	}
	for i := 0; i < ne; i++ {
		e, ok, err := decodeEvent(d)
		if err != nil {
			return b, fmt.Errorf("event %d: %w", i, err)
		}
		if ok {
			b.Events = append(b.Events, e)
		}
	}
	if n >= 3 {
		if c, err := d.PeekCode(); err == nil && c == msgpcode.Nil {
			_ = d.Skip()
		} else {
			r, err := d.DecodeInt64()
			if err != nil {
				return b, fmt.Errorf("data_parallel_rank: %w", err)
			}
			b.DataParallelRank = int(r)
		}
		for range n - 3 {
			if err := d.Skip(); err != nil {
				return b, err
			}
		}
	}
	return b, nil
}

// decodeEvent reads one tagged event; ok is false for an unknown tag.
func decodeEvent(d *msgpack.Decoder) (e Event, ok bool, err error) {
	n, err := d.DecodeArrayLen()
	if err != nil {
		return e, false, err
	}
	if n < 1 {
		return e, false, errors.New("event without tag")
	}
	tag, err := d.DecodeString()
	if err != nil {
		return e, false, fmt.Errorf("tag: %w", err)
	}
	left := n - 1
	field := func() bool {
		if left == 0 {
			return false
		}
		left--
		return true
	}
	switch tag {
	case "BlockStored":
		e.Kind = BlockStored
		if !field() {
			return e, false, errors.New("BlockStored without block_hashes")
		}
		if e.Hashes, err = decodeHashes(d); err != nil {
			return e, false, err
		}
		if field() {
			if e.Parent, e.HasParent, err = decodeOptHash(d); err != nil {
				return e, false, fmt.Errorf("parent_block_hash: %w", err)
			}
		}
		if field() {
			if e.TokenIDs, err = decodeTokens(d); err != nil {
				return e, false, err
			}
		}
		if field() {
			bs, err := d.DecodeInt64()
			if err != nil || bs < 0 || bs > math.MaxInt32 {
				return e, false, fmt.Errorf("block_size: %v", err)
			}
			e.BlockSize = int(bs)
		}
		if field() {
			if e.LoraID, err = decodeOptInt(d); err != nil {
				return e, false, fmt.Errorf("lora_id: %w", err)
			}
		}
		if field() {
			if e.Medium, err = decodeOptString(d); err != nil {
				return e, false, fmt.Errorf("medium: %w", err)
			}
		}
	case "BlockRemoved":
		e.Kind = BlockRemoved
		if !field() {
			return e, false, errors.New("BlockRemoved without block_hashes")
		}
		if e.Hashes, err = decodeHashes(d); err != nil {
			return e, false, err
		}
		if field() {
			if e.Medium, err = decodeOptString(d); err != nil {
				return e, false, fmt.Errorf("medium: %w", err)
			}
		}
	case "AllBlocksCleared":
		e.Kind = AllBlocksCleared
	}
	for ; left > 0; left-- {
		if err := d.Skip(); err != nil {
			return e, false, err
		}
	}
	return e, e.Kind != 0, nil
}

func decodeHashes(d *msgpack.Decoder) ([]uint64, error) {
	n, err := d.DecodeArrayLen()
	if err != nil {
		return nil, fmt.Errorf("block_hashes: %w", err)
	}
	if n < 0 {
		return nil, nil
	}
	hs := make([]uint64, 0, min(n, 4096))
	for range n {
		h, ok, err := decodeOptHash(d)
		if err != nil || !ok {
			return nil, fmt.Errorf("block_hashes: %v", err)
		}
		hs = append(hs, h)
	}
	return hs, nil
}

// decodeOptHash reads an int, bytes or nil hash. Bytes become their last
// 8 bytes big-endian, which is what vLLM's int form keeps.
func decodeOptHash(d *msgpack.Decoder) (uint64, bool, error) {
	c, err := d.PeekCode()
	if err != nil {
		return 0, false, err
	}
	switch {
	case c == msgpcode.Nil:
		return 0, false, d.Skip()
	case msgpcode.IsBin(c) || msgpcode.IsString(c):
		b, err := d.DecodeBytes()
		if err != nil {
			return 0, false, err
		}
		var tail [8]byte
		copy(tail[8-min(8, len(b)):], b[max(0, len(b)-8):])
		return binary.BigEndian.Uint64(tail[:]), true, nil
	default:
		h, err := d.DecodeInt64() // a uint64 comes back bit for bit
		return uint64(h), true, err
	}
}

func decodeTokens(d *msgpack.Decoder) ([]uint32, error) {
	n, err := d.DecodeArrayLen()
	if err != nil {
		return nil, fmt.Errorf("token_ids: %w", err)
	}
	if n < 0 {
		return nil, nil
	}
	ts := make([]uint32, 0, min(n, 1<<16))
	for range n {
		t, err := d.DecodeUint64()
		if err != nil || t > math.MaxUint32 {
			return nil, fmt.Errorf("token_ids: %v", err)
		}
		ts = append(ts, uint32(t))
	}
	return ts, nil
}

func decodeOptInt(d *msgpack.Decoder) (int, error) {
	c, err := d.PeekCode()
	if err != nil {
		return 0, err
	}
	if c == msgpcode.Nil {
		return 0, d.Skip()
	}
	v, err := d.DecodeInt64()
	return int(v), err
}

func decodeOptString(d *msgpack.Decoder) (string, error) {
	c, err := d.PeekCode()
	if err != nil {
		return "", err
	}
	if c == msgpcode.Nil {
		return "", d.Skip()
	}
	return d.DecodeString()
}

// Summary is a batch's net effect on an engine's device cache, in the
// order a consumer should apply it: forget everything when Cleared, then
// drop Removed, then add Stored.
type Summary struct {
	Cleared bool
	Stored  []uint64
	Removed []uint64
}

// Summarize nets out events: a block stored then removed in one batch is
// only removed, one removed then stored is only stored, and a clear
// forgets what came before it. Blocks on another medium than the device
// (CPU offloading) are left out: the device cache is what saves prefill.
func Summarize(events []Event) Summary {
	var s Summary
	state := make(map[uint64]Kind)
	order := make([]uint64, 0, 16)
	for i := range events {
		e := &events[i]
		if e.Medium != "" && e.Medium != MediumGPU {
			continue
		}
		switch e.Kind {
		case AllBlocksCleared:
			s.Cleared = true
			clear(state)
			order = order[:0]
		case BlockStored, BlockRemoved:
			for _, h := range e.Hashes {
				if _, seen := state[h]; !seen {
					order = append(order, h)
				}
				state[h] = e.Kind
			}
		}
	}
	for _, h := range order {
		if state[h] == BlockStored {
			s.Stored = append(s.Stored, h)
		} else {
			s.Removed = append(s.Removed, h)
		}
	}
	return s
}
