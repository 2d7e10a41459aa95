package affinity

import (
	"slices"
	"strings"
	"testing"
)

// referenceKeys is the definition of the keys written plainly: the words
// of strings.Fields, cut every MaxPieceBytes bytes, hashed block by block.
func referenceKeys(text string, blockSize int) (keys []uint64, pieces int) {
	var ps []string
	for _, w := range strings.Fields(text) {
		for len(w) > MaxPieceBytes {
			ps = append(ps, w[:MaxPieceBytes])
			w = w[MaxPieceBytes:]
		}
		ps = append(ps, w)
	}
	parent := uint64(rootSeed)
	for len(ps) >= blockSize {
		h := seeded(parent)
		for i, p := range ps[:blockSize] {
			if i > 0 {
				h = (h ^ ' ') * fnvPrime64
			}
			for j := 0; j < len(p); j++ {
				h = (h ^ uint64(p[j])) * fnvPrime64
			}
		}
		parent = mix(h)
		keys = append(keys, parent)
		pieces += blockSize
		ps = ps[blockSize:]
	}
	return keys, pieces + len(ps)
}

func FuzzKeys(f *testing.F) {
	for _, s := range []string{"", "a b c d e", " \t a \n\n b\u00a0c\u3000d  ", strings.Repeat("x", 40) + " y", "café 日本 naïve\u2029end", "\xff\xfe a \x85b"} {
		f.Add(s, uint8(2), uint8(3))
	}
	f.Fuzz(func(t *testing.T, text string, bs, cut uint8) {
		blockSize := int(bs%8) + 1
		want, pieces := referenceKeys(text, blockSize)
		h := NewHasher(blockSize)
		_, _ = h.WriteString(text)
		if got := h.Keys(); !slices.Equal(got, want) || h.Pieces() != pieces {
			t.Fatalf("keys %x (%d pieces), reference %x (%d pieces)", got, h.Pieces(), want, pieces)
		}
		// Split at a rune boundary, the keys are the same.
		c := min(int(cut), len(text))
		for c > 0 && c < len(text) && text[c]&0xc0 == 0x80 {
			c--
		}
		h.Reset(nil)
		_, _ = h.WriteString(text[:c])
		_, _ = h.WriteString(text[c:])
		if got := h.Keys(); !slices.Equal(got, want) {
			t.Fatalf("split at %d: keys %x, whole %x", c, got, want)
		}
	})
}
