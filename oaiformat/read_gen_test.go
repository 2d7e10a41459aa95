package oaiformat

import (
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/switchyard-ai/switchyard/wire"
)

// TestReadGenerated holds Read to readReference on generated request
// bodies: the members Read knows, spelled plainly, escaped or in another
// case, repeated, with values of every type (numbers at the edges of
// int64 and float64, strings with escapes, nested content), white space
// anywhere, and now and then a byte of invalid JSON, a cut or trailing
// data. Byte-level fuzzing seldom builds bodies this well formed.
func TestReadGenerated(t *testing.T) {
	n := 20000
	if testing.Short() {
		n = 2000
	}
	r := rand.New(rand.NewPCG(1, 2))
	for range n {
		g := reqGen{r}
		body := []byte(g.body())
		switch r.IntN(40) {
		case 0:
			body = body[:r.IntN(len(body)+1)]
		case 1:
			body = append(body, pick(r, []string{" {}", "x", "\n", " null", "]"})...)
		case 2:
			if len(body) > 0 {
				body[r.IntN(len(body))] = pick(r, []byte(`{}[],:"\ 0a-`))
			}
		}
		for _, api := range []wire.API{wire.API_API_CHAT, wire.API_API_COMPLETION} {
			p, err := Read(api, body)
			if !caseVariant(body) {
				sameAsReference(t, api, body, p, err)
			}
		}
	}
}

// topNames are the members of a request Read reads but the hand-off
// fields.
var topNames = []string{"model", "stream", "stream_options", "max_tokens", "max_completion_tokens", "n",
	"messages", "prompt", "stop", "temperature", "top_p", "tools", "functions", "other"}

func pick[T any](r *rand.Rand, xs []T) T { return xs[r.IntN(len(xs))] }

type reqGen struct{ r *rand.Rand }

func (g reqGen) ws() string {
	if g.r.IntN(5) != 0 {
		return ""
	}
	return pick(g.r, []string{" ", "\n", "\t", "\r\n  "})
}

func (g reqGen) key(name string) string {
	switch g.r.IntN(30) {
	case 0: // an escape
		i := g.r.IntN(len(name))
		return `"` + name[:i] + `\u00` + hexDigits[name[i]>>4:name[i]>>4+1] + hexDigits[name[i]&0xf:name[i]&0xf+1] + name[i+1:] + `"`
	case 1: // another case, which this test leaves out
		return `"` + strings.ToUpper(name[:1]) + name[1:] + `"`
	case 2:
		return `"` + name + `x"`
	}
	return `"` + name + `"`
}

func (g reqGen) body() string {
	switch g.r.IntN(50) {
	case 0:
		return g.ws() + g.any(0) + g.ws()
	case 1:
		return "null"
	}
	var b strings.Builder
	b.WriteString(g.ws() + "{" + g.ws())
	for i := range g.r.IntN(9) {
		if i > 0 {
			b.WriteString("," + g.ws())
		}
		name := pick(g.r, topNames)
		switch g.r.IntN(30) {
		case 0:
			name = pick(g.r, readNames) // a hand-off field, or a nested name
		case 1, 2, 3, 4, 5, 6:
			name = pick(g.r, []string{"messages", "prompt"})
		}
		b.WriteString(g.key(name) + g.ws() + ":" + g.ws() + g.value(name, 1) + g.ws())
	}
	b.WriteString("}" + g.ws())
	return b.String()
}

// value is a value for the member name, mostly of its type.
func (g reqGen) value(name string, depth int) string {
	if g.r.IntN(20) == 0 {
		return g.any(depth)
	}
	switch name {
	case "model", "role":
		return g.str()
	case "stream", "include_usage":
		return pick(g.r, []string{"true", "false"})
	case "max_tokens", "max_completion_tokens", "n", "temperature", "top_p":
		if g.r.IntN(8) == 0 {
			return g.number()
		}
		return pick(g.r, []string{"1", "2", "16", "0.5", "1e0"})
	case "stream_options":
		return g.object(depth, "include_usage", "x")
	case "messages":
		var b strings.Builder
		b.WriteString("[" + g.ws())
		for i := range g.r.IntN(5) {
			if i > 0 {
				b.WriteString("," + g.ws())
			}
			switch g.r.IntN(10) {
			case 0:
				b.WriteString(g.any(depth + 1))
			case 1, 2, 3:
				b.WriteString(g.object(depth+1, "role", "content", "name"))
			default:
				b.WriteString(`{"role":"user","content":` + g.value("content", depth+2) + "}")
			}
		}
		b.WriteString(g.ws() + "]")
		return b.String()
	case "content":
		if g.r.IntN(2) == 0 {
			return g.str()
		}
		return `[{"type":"text","text":` + g.str() + `},{"type":"image_url","image_url":{"url":"u"}}]`
	case "prompt":
		return pick(g.r, []string{g.str(), "[" + g.str() + "]", "[[1,2]]", "[]"})
	case "stop":
		return pick(g.r, []string{g.str(), "[" + g.str() + "," + g.str() + "]", `["a",null,""]`, "[1]", "[]"})
	case "tools", "functions":
		return pick(g.r, []string{"[]", "[ ]", `[{"type":"function","function":{"name":"f"}}]`, "{}"})
	}
	return g.any(depth)
}

// object is an object of members among names (repeats allowed).
func (g reqGen) object(depth int, names ...string) string {
	var b strings.Builder
	b.WriteString("{" + g.ws())
	for i := range g.r.IntN(4) {
		if i > 0 {
			b.WriteString("," + g.ws())
		}
		name := pick(g.r, names)
		b.WriteString(g.key(name) + ":" + g.ws() + g.value(name, depth+1))
	}
	b.WriteString(g.ws() + "}")
	return b.String()
}

func (g reqGen) any(depth int) string {
	k := g.r.IntN(7)
	if depth > 4 {
		k %= 5
	}
	switch k {
	case 0:
		return g.str()
	case 1:
		return g.number()
	case 2:
		return pick(g.r, []string{"true", "false"})
	case 3, 4:
		return "null"
	case 5:
		return "[" + g.any(depth+1) + "," + g.ws() + g.any(depth+1) + "]"
	}
	return `{"a":` + g.any(depth+1) + `,"role":` + g.any(depth+1) + "}"
}

func (g reqGen) str() string {
	var b strings.Builder
	b.WriteByte('"')
	for range g.r.IntN(5) {
		b.WriteString(pick(g.r, []string{"user", "system", "a", " ", "é", "😀", `\n`, `\"`, `\\`, `\/`, `\u00e9`,
			`\ud83d\ude00`, `\ud83d`, `\u0000`, "\u2028", "m"}))
	}
	b.WriteByte('"')
	return b.String()
}

func (g reqGen) number() string {
	return pick(g.r, []string{"0", "1", "2", "16", "17", "-1", "-0", "0.5", "1.0", "1e2", "1E+0", "2.0000001",
		"9223372036854775807", "9223372036854775808", "-9223372036854775808", "-9223372036854775809",
		"1e308", "1.8e308", "-1e400", "1e-400", "4.9e-324", "0.0000000000000000000000001"})
}

// TestReadDepth: encoding/json's limit of 10000 nested arrays and objects,
// counted from the body's object, in a message's content and in a member
// Read skips.
func TestReadDepth(t *testing.T) {
	nest := func(k int) string { return strings.Repeat("[", k) + strings.Repeat("]", k) }
	for _, tc := range []struct {
		body string
		ok   bool
	}{
		{`{"messages":[{"role":"user","content":` + nest(9997) + `}]}`, true},
		{`{"messages":[{"role":"user","content":` + nest(9998) + `}]}`, false},
		{`{"messages":[{"role":"user","content":"x"}],"x":` + nest(9999) + `}`, true},
		{`{"messages":[{"role":"user","content":"x"}],"x":` + nest(10000) + `}`, false},
		{`{"messages":[{"role":"user","content":"x"}],"stream_options":{"x":` + nest(9998) + `}}`, true},
		{`{"messages":[{"role":"user","content":"x"}],"stream_options":{"x":` + nest(9999) + `}}`, false},
	} {
		p, err := Read(wire.API_API_CHAT, []byte(tc.body))
		sameAsReference(t, wire.API_API_CHAT, []byte(tc.body), p, err)
		if (err == nil) != tc.ok {
			t.Errorf("%.60s...: %v", tc.body, err)
		}
	}
}
