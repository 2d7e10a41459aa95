package affinity

import (
	"unicode"
	"unicode/utf8"
)

const (
	// DefaultBlockSize is the pieces per block: vLLM's default block size
	// in tokens, so that a simulated engine's blocks and the broker's keys
	// line up (see docs/affinity.md).
	DefaultBlockSize = 16
	// MaxPieceBytes bounds a piece, so that text without spaces (code, CJK)
	// still makes blocks of a bounded size.
	MaxPieceBytes = 16
)

const (
	fnvOffset64 = 14695981039346656037
	fnvPrime64  = 1099511628211
	fnvOffset32 = 2166136261
	fnvPrime32  = 16777619
	// rootSeed is block 0's "parent key".
	rootSeed = 0x9e3779b97f4a7c15
)

// asciiSpace marks the ASCII bytes that unicode.IsSpace accepts, so that
// pieces are exactly strings.Fields' words (below the size bound).
var asciiSpace = [utf8.RuneSelf]bool{'\t': true, '\n': true, '\v': true, '\f': true, '\r': true, ' ': true}

// Hasher computes the block keys of a text written to it in parts. A
// word may span two writes, but a write must not end inside a multi-byte
// character. Its zero value is not usable; [NewHasher] makes one. A Hasher
// is not safe for concurrent use; Reset lets a caller reuse one.
type Hasher struct {
	blockSize int
	ids       bool

	h        uint64 // FNV-1a state of the block in progress
	pieces   int    // complete pieces in the block in progress
	pieceLen int    // bytes of the piece in progress
	idh      uint32 // FNV-1a 32 of the piece in progress
	total    int    // complete pieces in all
	keys     []uint64
	pieceIDs []uint32

	// Block ends (RecordBlockEnds): where the piece in progress last grew.
	ends      bool
	tag       int
	pos       int // bytes of the current write consumed
	lastTag   int
	lastEnd   int
	blockEnds []BlockEnd
}

// BlockEnd tells where a block's last piece ends: after byte Off of the
// text written since Mark(Tag).
type BlockEnd struct {
	Tag, Off int
}

// NewHasher returns a Hasher for blocks of blockSize pieces (at least 1;
// [DefaultBlockSize] when 0 or less).
func NewHasher(blockSize int) *Hasher {
	h := &Hasher{}
	h.init(blockSize)
	return h
}

func (h *Hasher) init(blockSize int) {
	if blockSize <= 0 {
		blockSize = DefaultBlockSize
	}
	h.blockSize = blockSize
	h.Reset(h.keys[:0])
}

// RecordPieceIDs makes the Hasher also record an id per piece (FNV-1a 32
// of its bytes), which a simulated engine reports as its token ids.
func (h *Hasher) RecordPieceIDs(on bool) { h.ids = on }

// Reset starts a new text; keys are appended to dst from now on.
func (h *Hasher) Reset(dst []uint64) {
	h.h = seeded(rootSeed)
	h.pieces, h.pieceLen, h.total = 0, 0, 0
	h.idh = fnvOffset32
	h.keys = dst
	h.pieceIDs = h.pieceIDs[:0]
	h.tag, h.pos, h.lastTag, h.lastEnd = 0, 0, 0, 0
	h.blockEnds = h.blockEnds[:0]
}

// RecordBlockEnds makes the Hasher record, per block, where its last
// piece ends ([Hasher.BlockEnds]), so that a caller can tell which text a
// block key stands for.
func (h *Hasher) RecordBlockEnds(on bool) { h.ends = on }

// Mark starts a new part of the text: offsets of block ends are counted
// from here, under tag.
func (h *Hasher) Mark(tag int) { h.tag, h.pos = tag, 0 }

// BlockEnds returns the recorded block ends, one per key so far; the
// slice is reused by Reset.
func (h *Hasher) BlockEnds() []BlockEnd { return h.blockEnds }

// BlockSize returns the pieces per block.
func (h *Hasher) BlockSize() int { return h.blockSize }

func seeded(parent uint64) uint64 {
	s := uint64(fnvOffset64)
	for i := range 8 {
		s ^= (parent >> (8 * i)) & 0xff
		s *= fnvPrime64
	}
	return s
}

// WriteString adds s to the text. It never fails.
func (h *Hasher) WriteString(s string) (int, error) {
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if asciiSpace[c] {
				h.endPiece()
			} else {
				h.addByte(c)
				if h.ends {
					h.lastTag, h.lastEnd = h.tag, h.pos+i+1
				}
			}
			i++
			continue
		}
		r, n := utf8.DecodeRuneInString(s[i:])
		if unicode.IsSpace(r) {
			h.endPiece()
		} else {
			for j := range n {
				h.addByte(s[i+j])
				if h.ends {
					h.lastTag, h.lastEnd = h.tag, h.pos+i+j+1
				}
			}
		}
		i += n
	}
	h.pos += len(s)
	return len(s), nil
}

func (h *Hasher) addByte(c byte) {
	if h.pieceLen == MaxPieceBytes {
		h.endPiece()
	}
	if h.pieceLen == 0 && h.pieces > 0 {
		// A separator, so that "ab c" and "a bc" differ.
		h.h ^= ' '
		h.h *= fnvPrime64
	}
	h.h ^= uint64(c)
	h.h *= fnvPrime64
	h.idh ^= uint32(c)
	h.idh *= fnvPrime32
	h.pieceLen++
}

func (h *Hasher) endPiece() {
	if h.pieceLen == 0 {
		return
	}
	h.pieceLen = 0
	h.pieces++
	h.total++
	if h.ids {
		h.pieceIDs = append(h.pieceIDs, h.idh)
	}
	h.idh = fnvOffset32
	if h.pieces == h.blockSize {
		if h.ends {
			h.blockEnds = append(h.blockEnds, BlockEnd{Tag: h.lastTag, Off: h.lastEnd})
		}
		k := mix(h.h)
		h.keys = append(h.keys, k)
		h.h = seeded(k)
		h.pieces = 0
	}
}

// mix is splitmix64's finaliser: FNV's low bits are weak, and keys feed
// maps and modulo sharding.
func mix(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

// Keys ends the piece in progress (the text so far ends a word) and
// returns the keys of the complete blocks. A partial last block has no
// key: like an engine, only full blocks are cached. Writing more text
// afterwards continues the text as if it began with a space.
func (h *Hasher) Keys() []uint64 {
	h.endPiece()
	return h.keys
}

// Pieces returns how many complete pieces were written, the token count
// of the token-less model.
func (h *Hasher) Pieces() int { return h.total }

// PieceIDs returns the ids of the complete pieces when RecordPieceIDs is
// on; the slice is reused by Reset.
func (h *Hasher) PieceIDs() []uint32 { return h.pieceIDs }

// AppendKeys appends the block keys of text, blocks of blockSize pieces,
// to dst. It does not allocate when dst has room.
func AppendKeys(dst []uint64, blockSize int, text string) []uint64 {
	var h Hasher
	h.blockSize = blockSize
	if blockSize <= 0 {
		h.blockSize = DefaultBlockSize
	}
	h.Reset(dst)
	h.Mark(ChatContent(0))
	_, _ = h.WriteString(text)
	return h.Keys()
}

// Message is one chat message as the broker sees it.
type Message struct {
	Role    string
	Content string
}

// AppendChatKeys appends the block keys of a chat prompt, rendered as
// "role: content\n" per message followed by "assistant:" (the simulated
// engine's template, so that its KV events name the same keys). The
// rendering only has to be stable: a real engine's template differs, which
// shifts nothing but the exact block boundaries.
func AppendChatKeys(dst []uint64, blockSize int, msgs []Message) []uint64 {
	var h Hasher
	h.blockSize = blockSize
	if blockSize <= 0 {
		h.blockSize = DefaultBlockSize
	}
	h.Reset(dst)
	h.writeChat(msgs)
	return h.Keys()
}

// writeChat writes the chat rendering of AppendChatKeys, marked with the
// tags of [ChatRole], [ChatContent] and [ChatTail].
func (h *Hasher) writeChat(msgs []Message) {
	for i, m := range msgs {
		h.Mark(ChatRole(i))
		_, _ = h.WriteString(m.Role)
		_, _ = h.WriteString(": ")
		h.Mark(ChatContent(i))
		_, _ = h.WriteString(m.Content)
		_, _ = h.WriteString("\n")
	}
	h.Mark(ChatTail(len(msgs)))
	_, _ = h.WriteString("assistant:")
}

// Tags of the parts of a chat prompt in [ChatBlockEnds]: message i's role
// (with its ": "), its content, and the closing "assistant:" after n
// messages. A completion prompt is ChatContent(0).
func ChatRole(i int) int    { return 2 * i }
func ChatContent(i int) int { return 2*i + 1 }
func ChatTail(n int) int    { return 2 * n }

// ChatBlockEnds appends to dst, per block key of AppendChatKeys(msgs),
// where the block's last piece ends: in message i's role, in its content
// (Off is then the byte offset in Content just past the piece), or in the
// closing "assistant:". An engine that has cached a prompt up to that
// point holds what the key stands for (see docs/affinity.md).
func ChatBlockEnds(dst []BlockEnd, blockSize int, msgs []Message) []BlockEnd {
	h := NewHasher(blockSize)
	h.RecordBlockEnds(true)
	h.blockEnds = dst
	h.writeChat(msgs)
	h.Keys()
	return h.blockEnds
}

// PromptBlockEnds is ChatBlockEnds for a completion prompt, one part
// tagged ChatContent(0).
func PromptBlockEnds(dst []BlockEnd, blockSize int, text string) []BlockEnd {
	h := NewHasher(blockSize)
	h.RecordBlockEnds(true)
	h.blockEnds = dst
	h.Mark(ChatContent(0))
	_, _ = h.WriteString(text)
	h.Keys()
	return h.blockEnds
}
