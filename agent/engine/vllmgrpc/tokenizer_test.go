package vllmgrpc

import (
	"math/rand/v2"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/switchyard-ai/switchyard/simengine"
)

// splitVocab has tokens that split multi-byte characters: é (C3 A9),
// 日 (E6 97 A5), 本 (E6 9C AC), and a lone continuation byte.
var splitVocab = Tokens{
	[]byte(" caf\xc3"), []byte("\xa9"), []byte(" \xe6\x97"), []byte("\xa5\xe6\x9c"), []byte("\xac"),
	[]byte("ab"), []byte("\xe6"), []byte("\x97"), []byte("\xa5"), []byte("\xff"), []byte(" "),
}

func TestDetokenizerSplitCharacters(t *testing.T) {
	for _, tc := range []struct {
		name  string
		steps [][]uint32
		want  []string // output of each step, then of Flush
	}{
		{"é across two tokens", [][]uint32{{0}, {1}}, []string{" caf", "é", ""}},
		{"日本 across three tokens", [][]uint32{{2}, {3}, {4}}, []string{" ", "日", "本", ""}},
		{"one byte at a time", [][]uint32{{6}, {7}, {8}}, []string{"", "", "日", ""}},
		{"incomplete at the end", [][]uint32{{5}, {6, 7}}, []string{"ab", "", "\uFFFD\uFFFD"}},
		{"invalid byte at once", [][]uint32{{9, 5}}, []string{"\uFFFDab", ""}},
		{"broken sequence", [][]uint32{{6}, {5}}, []string{"", "\uFFFDab", ""}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := NewDetokenizer(splitVocab)
			var got []string
			for _, ids := range tc.steps {
				out, err := d.Add(nil, ids)
				if err != nil {
					t.Fatal(err)
				}
				got = append(got, string(out))
			}
			got = append(got, string(d.Flush(nil)))
			if strings.Join(got, "|") != strings.Join(tc.want, "|") {
				t.Fatalf("got %q, want %q", got, tc.want)
			}
		})
	}
	if _, err := NewDetokenizer(splitVocab).Add(nil, []uint32{99}); err == nil {
		t.Fatal("unknown id: no error")
	}
}

// TestDetokenizerProperty: for random token sequences cut into random
// steps, the incremental output is exactly the whole decode, no step emits
// an incomplete character, and U+FFFD appears only for bytes that are
// invalid in the whole byte string.
func TestDetokenizerProperty(t *testing.T) {
	tok := simengine.SimTokenizer()
	var v Tokens
	for id := range tok.Size() {
		b, _ := tok.Token(uint32(id))
		v = append(v, b)
	}
	// Bias towards the tokens that hold parts of characters.
	var hard []uint32
	for id, b := range v {
		if !utf8.Valid(b) {
			hard = append(hard, uint32(id))
		}
	}
	if len(hard) < 3 {
		t.Fatalf("only %d tokens split characters", len(hard))
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for iter := range 3000 {
		n := rng.IntN(40)
		ids := make([]uint32, n)
		var all []byte
		for i := range ids {
			if rng.IntN(2) == 0 {
				ids[i] = hard[rng.IntN(len(hard))]
			} else {
				ids[i] = uint32(rng.IntN(len(v)))
			}
			all = append(all, v[ids[i]]...)
		}
		want := string([]rune(string(all))) // Go's decoding: U+FFFD per invalid byte
		d := NewDetokenizer(v)
		var got strings.Builder
		for i := 0; i < n; {
			k := min(n-i, 1+rng.IntN(4))
			out, err := d.Add(nil, ids[i:i+k])
			if err != nil {
				t.Fatal(err)
			}
			if !utf8.Valid(out) {
				t.Fatalf("iter %d: step emitted invalid UTF-8 %q", iter, out)
			}
			got.Write(out)
			i += k
		}
		got.Write(d.Flush(nil))
		if got.String() != want {
			t.Fatalf("iter %d ids %v: incremental %q, all at once %q", iter, ids, got.String(), want)
		}
		if all, err := DecodeAll(v, ids); err != nil || all != want {
			t.Fatalf("DecodeAll %q %v, want %q", all, err, want)
		}
	}
}

func TestStopFilter(t *testing.T) {
	for _, tc := range []struct {
		name   string
		stops  []string
		pieces []string
		want   string
		stop   bool
	}{
		{"none", nil, []string{"a", "b"}, "ab", false},
		{"within a piece", []string{"cd"}, []string{"abcdef"}, "ab", true},
		{"across pieces", []string{"cd"}, []string{"abc", "def"}, "ab", true},
		{"not found", []string{"xyz"}, []string{"abc", "déf"}, "abcdéf", false},
		{"earliest", []string{"f", "b"}, []string{"abcdef"}, "a", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newStopFilter(tc.stops)
			var out []byte
			for _, p := range tc.pieces {
				n := len(out)
				out = f.push(out, []byte(p))
				if !utf8.Valid(out[n:]) {
					t.Fatalf("split a character: %q", out[n:])
				}
			}
			out = f.flush(out)
			if string(out) != tc.want || f.stopped != tc.stop {
				t.Fatalf("got %q stopped %v, want %q %v", out, f.stopped, tc.want, tc.stop)
			}
		})
	}
}

func TestParseTokenizer(t *testing.T) {
	js, err := simengine.SimTokenizer().MarshalJSON()
	if err != nil {
		t.Fatal(err)
	}
	v, err := ParseTokenizer(js)
	if err != nil {
		t.Fatal(err)
	}
	if len(v) != simengine.SimTokenizer().Size() {
		t.Fatalf("%d tokens, want %d", len(v), simengine.SimTokenizer().Size())
	}
	for _, bad := range []string{`{}`, `{"format":"x","tokens":[{"id":0,"bytes":"AA=="}]}`,
		`{"format":"` + TokenizerFormat + `","tokens":[{"id":0,"bytes":"AA=="},{"id":0,"bytes":"AQ=="}]}`, `nope`} {
		if _, err := ParseTokenizer([]byte(bad)); err == nil {
			t.Errorf("%s: no error", bad)
		}
	}
}
