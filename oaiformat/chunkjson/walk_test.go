package chunkjson

import (
	"encoding/json"
	"testing"
)

// walkArray checks the array at d[i] with Open, SkipValue and NextElement.
func walkArray(d []byte, i int) (int, error) {
	i, end, err := Open(d, i)
	for ; !end && err == nil; i, end, err = NextElement(d, i) {
		if i, err = SkipValue(d, i, 1); err != nil {
			return i, err
		}
	}
	return i, err
}

// TestWalkTruncated: the walking functions report a cut document as an
// error, never reading past its end.
func TestWalkTruncated(t *testing.T) {
	doc := []byte(`[1, "a", {"k": [true]} , null ]`)
	if _, err := walkArray(doc, 0); err != nil {
		t.Fatal(err)
	}
	for n := 1; n < len(doc); n++ {
		if _, err := walkArray(doc[:n], 0); err == nil {
			t.Errorf("%q: no error", doc[:n])
		}
	}
	obj := []byte(`{"a" : 1, "b\u0041": "x\n"}`)
	for n := 1; n <= len(obj); n++ {
		d := obj[:n]
		i, end, err := Open(d, 0)
		for ; !end && err == nil; i, end, err = NextMember(d, i) {
			var v int
			if _, _, v, err = Key(d, i); err != nil {
				break
			}
			if i, err = SkipValue(d, v, 1); err != nil {
				break
			}
		}
		if (err == nil) != (n == len(obj)) {
			t.Errorf("%q: %v", d, err)
		}
	}
}

// TestUnquote: Unquote and AppendUnquoted decode strings as encoding/json
// does.
func TestUnquote(t *testing.T) {
	for _, s := range []string{`"plain"`, `"\u00e9\n\"\\\/"`, `"\ud83d\ude00"`, `"\ud83d"`, `"\ud83dx\ude00"`,
		`"\ud83d\u0041"`, "\"\xff\xc3\"", `"é😀"`, `""`} {
		var want string
		if err := json.Unmarshal([]byte(s), &want); err != nil {
			t.Fatal(err)
		}
		v, _, next, err := String([]byte(s), 0)
		if err != nil || next != len(s) {
			t.Fatalf("%s: String %d, %v", s, next, err)
		}
		if got := Unquote(v); got != want {
			t.Errorf("%s: Unquote %q, want %q", s, got, want)
		}
		if got := AppendUnquoted([]byte("x"), v); string(got) != "x"+want {
			t.Errorf("%s: AppendUnquoted %q, want %q", s, got, "x"+want)
		}
	}
}
