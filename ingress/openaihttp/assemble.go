package openaihttp

import (
	"bytes"
	"encoding/json"
	"errors"
	"slices"
	"strings"

	"github.com/switchyard-ai/switchyard/oaiformat/jsonscan"
	"github.com/switchyard-ai/switchyard/wire"
)

// assembler builds a non-streaming OpenAI response from the engine's
// stream, the way OpenAI's SDKs accumulate one: per choice index, the
// message's content, reasoning and refusal are concatenated, tool calls
// are merged by their index (id and type from the deltas that carry them,
// name and arguments concatenated), and logprobs' arrays are concatenated.
// Any other member of a chunk, a choice or a delta (system_fingerprint,
// vLLM's stop_reason, ...) keeps the last value the engine sent, so what
// an engine adds survives as it does in the stream.
type assembler struct {
	chat    bool
	id      string
	created int64
	model   string
	extra   members // top-level members other than the ones built here
	choices []*choiceAcc
	byIndex map[int]*choiceAcc // choices by their index: one lookup per event, however many
	tools   int                // tool calls across choices (see maxToolCalls)
}

// Bounds of an assembled answer beyond its bytes (which the broker
// bounds): an engine's indexes are the assembler's keys, and a choice or
// tool call costs memory of its own however short. A request asks for at
// most oaiformat.MaxN choices; the bounds leave engines room beyond that.
const (
	maxChoices   = 256
	maxToolCalls = 4096
)

// errTooManyParts is an answer with more choices or tool calls than an
// assembled answer holds.
var errTooManyParts = errors.New("the engine's answer has more choices or tool calls than an answer holds")

// choiceAcc accumulates one choice.
type choiceAcc struct {
	index      int
	role       string
	content    strings.Builder
	reasoning  map[string]*strings.Builder // reasoning_content or reasoning, as the engine names it
	refusal    strings.Builder
	hasRefusal bool
	tools      []*toolAcc
	toolIndex  map[int]*toolAcc
	logprobs   *logprobsAcc
	finish     string
	extra      members // other members of the choice
	msgExtra   members // other members of the delta
}

type toolAcc struct {
	index int
	id    string
	typ   string
	name  strings.Builder
	args  strings.Builder
	extra members
}

// members keeps JSON members in the order they first appeared, each with
// its last value.
type members struct {
	keys []string
	vals map[string]json.RawMessage
}

func (m *members) set(k string, v json.RawMessage) {
	if m.vals == nil {
		m.vals = map[string]json.RawMessage{}
	}
	if _, ok := m.vals[k]; !ok {
		m.keys = append(m.keys, k)
	}
	m.vals[k] = v
}

// logprobsAcc concatenates the arrays of a logprobs object (chat's content
// and refusal; completions' tokens, token_logprobs, top_logprobs and
// text_offset) and keeps the last value of anything else.
type logprobsAcc struct {
	keys   []string
	arrays map[string][]json.RawMessage
	other  map[string]json.RawMessage
}

func (l *logprobsAcc) add(o *parsedLogprobs) {
	for _, k := range o.keys {
		_, inArrays := l.arrays[k]
		if _, inOther := l.other[k]; !inArrays && !inOther {
			l.keys = append(l.keys, k)
		}
		if arr, ok := o.arrays[k]; ok {
			l.arrays[k] = append(l.arrays[k], arr...)
			delete(l.other, k)
			continue
		}
		l.other[k] = o.vals[k]
	}
}

func (l *logprobsAcc) MarshalJSON() ([]byte, error) {
	var o object
	for _, k := range l.keys {
		if v, ok := l.other[k]; ok {
			o = append(o, member{k, v})
			continue
		}
		arr := l.arrays[k]
		if arr == nil {
			arr = []json.RawMessage{}
		}
		o = append(o, member{k, arr})
	}
	return o.MarshalJSON()
}

// parseObject reads the members of the JSON object raw in order, keys
// unquoted.
func parseObject(raw []byte) (*members, error) {
	o := &members{}
	var err error
	if merr := jsonscan.Members(raw, func(key []byte, quoted bool, _, value []byte) {
		k := string(key)
		if quoted {
			if e := json.Unmarshal([]byte(`"`+k+`"`), &k); e != nil && err == nil {
				err = e
			}
		}
		o.set(k, value)
	}); merr != nil {
		return nil, merr
	}
	return o, err
}

// parsedLogprobs is a logprobs object with the elements of its arrays.
type parsedLogprobs struct {
	members
	arrays map[string][]json.RawMessage
}

func parseLogprobs(raw []byte) (*parsedLogprobs, error) {
	o, err := parseObject(raw)
	if err != nil {
		return nil, err
	}
	l := &parsedLogprobs{members: *o, arrays: map[string][]json.RawMessage{}}
	for _, k := range l.keys {
		if v := l.vals[k]; v[0] == '[' {
			var elems []json.RawMessage
			if err := json.Unmarshal(v, &elems); err != nil {
				return nil, err
			}
			l.arrays[k] = elems
		}
	}
	return l, nil
}

// The members of a chunk, choice, delta and tool call the assembler builds
// itself; everything else is passed through.
var (
	chunkOwn  = []string{"id", "object", "created", "model", "choices", "usage"}
	choiceOwn = []string{"index", "delta", "message", "text", "logprobs", "finish_reason"}
	deltaOwn  = []string{"role", "content", "refusal", "tool_calls", "reasoning_content", "reasoning"}
	toolOwn   = []string{"index", "id", "type", "function"}
)

// The typed view of the members the assembler reads.
type (
	rawChunk struct {
		ID      string            `json:"id"`
		Created int64             `json:"created"`
		Model   string            `json:"model"`
		Choices []json.RawMessage `json:"choices"`
	}
	rawChoice struct {
		Index        int             `json:"index"`
		Text         *string         `json:"text"`
		Delta        json.RawMessage `json:"delta"`
		Message      json.RawMessage `json:"message"`
		Logprobs     json.RawMessage `json:"logprobs"`
		FinishReason *string         `json:"finish_reason"`
	}
	rawDelta struct {
		Role             string            `json:"role"`
		Content          *string           `json:"content"`
		Refusal          *string           `json:"refusal"`
		ReasoningContent *string           `json:"reasoning_content"`
		Reasoning        *string           `json:"reasoning"`
		ToolCalls        []json.RawMessage `json:"tool_calls"`
	}
	rawTool struct {
		Index    *int   `json:"index"`
		ID       string `json:"id"`
		Type     string `json:"type"`
		Function struct {
			Name      string `json:"name"`
			Arguments string `json:"arguments"`
		} `json:"function"`
	}
)

// An engine event decoded, before any of it is applied, so that an event
// that does not decode adds nothing twice.
type (
	parsedChunk struct {
		rawChunk
		all     *members
		choices []parsedChoice
	}
	parsedChoice struct {
		rawChoice
		all      *members
		logprobs *parsedLogprobs // nil when absent or null
		delta    *rawDelta       // nil when absent or null
		deltaAll *members
		whole    bool // a message, not a delta
		tools    []parsedTool
	}
	parsedTool struct {
		rawTool
		all *members
	}
)

func isNull(raw json.RawMessage) bool {
	t := bytes.TrimSpace(raw)
	return len(t) == 0 || bytes.Equal(t, []byte("null"))
}

// decode reads raw into the typed view v and into its members in order.
func decode(raw []byte, v any) (*members, error) {
	if err := json.Unmarshal(raw, v); err != nil {
		return nil, err
	}
	return parseObject(raw)
}

func parseChunk(raw []byte) (*parsedChunk, error) {
	pc := &parsedChunk{}
	var err error
	if pc.all, err = decode(raw, &pc.rawChunk); err != nil {
		return nil, err
	}
	for _, cr := range pc.Choices {
		var c parsedChoice
		if c.all, err = decode(cr, &c.rawChoice); err != nil {
			return nil, err
		}
		if !isNull(c.Logprobs) {
			if c.logprobs, err = parseLogprobs(c.Logprobs); err != nil {
				return nil, err
			}
		}
		// A stream's choices carry a delta; an engine that ignored
		// stream=true sent one object whose choices carry the message.
		msg := c.Delta
		if isNull(msg) && !isNull(c.Message) {
			msg, c.whole = c.Message, true
		}
		if !isNull(msg) {
			c.delta = new(rawDelta)
			if c.deltaAll, err = decode(msg, c.delta); err != nil {
				return nil, err
			}
			for _, tr := range c.delta.ToolCalls {
				var t parsedTool
				if t.all, err = decode(tr, &t.rawTool); err != nil {
					return nil, err
				}
				c.tools = append(c.tools, t)
			}
		}
		pc.choices = append(pc.choices, c)
	}
	return pc, nil
}

// add takes one engine event. An event that does not decode as an OpenAI
// chunk still adds the text the agent read from it to the first choice,
// so the answer is never shorter than what a streaming client would see.
// An answer past maxChoices or maxToolCalls is errTooManyParts.
func (a *assembler) add(ev *wire.Event) error {
	pc, err := parseChunk(ev.GetRaw())
	if err != nil {
		c, err := a.choice(0)
		if err != nil {
			return err
		}
		c.content.WriteString(ev.GetDeltaText())
		if f := ev.GetFinishReason(); f != "" {
			c.finish = f
		}
		return nil
	}
	if a.id == "" {
		a.id, a.created, a.model = pc.ID, pc.Created, pc.Model
	}
	passThrough(&a.extra, pc.all, chunkOwn)
	for i := range pc.choices {
		if err := a.apply(&pc.choices[i]); err != nil {
			return err
		}
	}
	return nil
}

func (a *assembler) apply(pc *parsedChoice) error {
	c, err := a.choice(pc.Index)
	if err != nil {
		return err
	}
	passThrough(&c.extra, pc.all, choiceOwn)
	if pc.Text != nil {
		c.content.WriteString(*pc.Text)
	}
	if pc.FinishReason != nil && *pc.FinishReason != "" {
		c.finish = *pc.FinishReason
	}
	if pc.logprobs != nil {
		if c.logprobs == nil {
			c.logprobs = &logprobsAcc{arrays: map[string][]json.RawMessage{}, other: map[string]json.RawMessage{}}
		}
		c.logprobs.add(pc.logprobs)
	}
	d := pc.delta
	if d == nil {
		return nil
	}
	passThrough(&c.msgExtra, pc.deltaAll, deltaOwn)
	if d.Role != "" {
		c.role = d.Role
	}
	if d.Content != nil {
		c.content.WriteString(*d.Content)
	}
	if d.Refusal != nil {
		c.refusal.WriteString(*d.Refusal)
		c.hasRefusal = true
	}
	for _, r := range []struct {
		name string
		v    *string
	}{{"reasoning_content", d.ReasoningContent}, {"reasoning", d.Reasoning}} {
		if r.v == nil {
			continue
		}
		if c.reasoning == nil {
			c.reasoning = map[string]*strings.Builder{}
		}
		if c.reasoning[r.name] == nil {
			c.reasoning[r.name] = &strings.Builder{}
		}
		c.reasoning[r.name].WriteString(*r.v)
	}
	for i, t := range pc.tools {
		idx := i
		switch {
		case t.Index != nil:
			idx = *t.Index
		case !pc.whole:
			idx = len(c.tools) // an engine that numbers nothing: one call per delta
		}
		acc, err := a.tool(c, idx)
		if err != nil {
			return err
		}
		passThrough(&acc.extra, t.all, toolOwn)
		if t.ID != "" {
			acc.id = t.ID
		}
		if t.Type != "" {
			acc.typ = t.Type
		}
		acc.name.WriteString(t.Function.Name)
		acc.args.WriteString(t.Function.Arguments)
	}
	return nil
}

// passThrough records the members of o not in own.
func passThrough(m *members, o *members, own []string) {
	for _, k := range o.keys {
		if !slices.Contains(own, k) {
			m.set(k, o.vals[k])
		}
	}
}

// choice returns the choice of index, new if the answer has none yet.
func (a *assembler) choice(index int) (*choiceAcc, error) {
	if c, ok := a.byIndex[index]; ok {
		return c, nil
	}
	if len(a.choices) == maxChoices {
		return nil, errTooManyParts
	}
	if a.byIndex == nil {
		a.byIndex = make(map[int]*choiceAcc, 1)
	}
	c := &choiceAcc{index: index}
	a.choices = append(a.choices, c)
	a.byIndex[index] = c
	return c, nil
}

// tool returns the tool call of index in choice c, new if it has none yet.
func (a *assembler) tool(c *choiceAcc, index int) (*toolAcc, error) {
	if t, ok := c.toolIndex[index]; ok {
		return t, nil
	}
	if a.tools == maxToolCalls {
		return nil, errTooManyParts
	}
	if c.toolIndex == nil {
		c.toolIndex = make(map[int]*toolAcc, 1)
	}
	a.tools++
	t := &toolAcc{index: index}
	c.tools = append(c.tools, t)
	c.toolIndex[index] = t
	return t, nil
}

// response renders the whole answer; finish is the final chunk's finish
// reason, used for a choice the stream gave none.
func (a *assembler) response(kind apiKind, finish string, u any) object {
	if len(a.choices) == 0 {
		_, _ = a.choice(0) // the first: never past the bound
	}
	slices.SortFunc(a.choices, func(x, y *choiceAcc) int { return x.index - y.index })
	choices := make([]object, 0, len(a.choices))
	for _, c := range a.choices {
		f := c.finish
		if f == "" && len(a.choices) == 1 {
			f = finish
		}
		o := object{{"index", c.index}}
		if a.chat {
			o = append(o, member{"message", c.message()})
		} else {
			o = append(o, member{"text", c.content.String()})
		}
		var lp any
		if c.logprobs != nil {
			lp = c.logprobs
		}
		var fr any
		if f != "" {
			fr = f
		}
		o = append(o, member{"logprobs", lp}, member{"finish_reason", fr})
		for _, k := range c.extra.keys {
			o = append(o, member{k, c.extra.vals[k]})
		}
		choices = append(choices, o)
	}
	out := object{{"id", a.id}, {"object", kind.object}, {"created", a.created}, {"model", a.model}, {"choices", choices}, {"usage", u}}
	for _, k := range a.extra.keys {
		out = append(out, member{k, a.extra.vals[k]})
	}
	return out
}

func (c *choiceAcc) message() object {
	role := c.role
	if role == "" {
		role = "assistant"
	}
	m := object{{"role", role}}
	// As OpenAI answers: content is null when the model only called tools
	// (vLLM's first delta of every choice carries an empty content).
	var content any
	if c.content.Len() > 0 || len(c.tools) == 0 {
		content = c.content.String()
	}
	m = append(m, member{"content", content})
	if c.hasRefusal {
		m = append(m, member{"refusal", c.refusal.String()})
	}
	for _, name := range []string{"reasoning_content", "reasoning"} {
		if b := c.reasoning[name]; b != nil {
			m = append(m, member{name, b.String()})
		}
	}
	if len(c.tools) > 0 {
		slices.SortFunc(c.tools, func(x, y *toolAcc) int { return x.index - y.index })
		calls := make([]object, 0, len(c.tools))
		for _, t := range c.tools {
			typ := t.typ
			if typ == "" {
				typ = "function"
			}
			call := object{{"id", t.id}, {"type", typ}, {"function", object{{"name", t.name.String()}, {"arguments", t.args.String()}}}}
			for _, k := range t.extra.keys {
				call = append(call, member{k, t.extra.vals[k]})
			}
			calls = append(calls, call)
		}
		m = append(m, member{"tool_calls", calls})
	}
	for _, k := range c.msgExtra.keys {
		m = append(m, member{k, c.msgExtra.vals[k]})
	}
	return m
}

// object is a JSON object whose members keep their order.
type object []member

type member struct {
	key string
	val any
}

// MarshalJSON leaves <, > and & as they are, as the engine wrote them
// (encoding/json would escape them, also inside a json.RawMessage); the
// response is written with an encoder that does the same.
func (o object) MarshalJSON() ([]byte, error) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	b.WriteByte('{')
	for i, m := range o {
		if i > 0 {
			b.WriteByte(',')
		}
		if err := enc.Encode(m.key); err != nil {
			return nil, err
		}
		b.Truncate(b.Len() - 1) // Encode's newline
		b.WriteByte(':')
		if err := enc.Encode(m.val); err != nil {
			return nil, err
		}
		b.Truncate(b.Len() - 1)
	}
	b.WriteByte('}')
	return b.Bytes(), nil
}
