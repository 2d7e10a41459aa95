package loadgen

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"strconv"
)

// Prompt is one line of a prompts file: a "prompt" string or chat
// "messages" (passed through unchanged), and an optional "max_tokens" that
// overrides [Config.MaxTokens].
type Prompt struct {
	Prompt    string          `json:"prompt,omitempty"`
	Messages  json.RawMessage `json:"messages,omitempty"`
	MaxTokens int             `json:"max_tokens,omitempty"`
}

func (p Prompt) validate(api API) error {
	switch {
	case p.Prompt == "" && len(p.Messages) == 0:
		return fmt.Errorf("%w: want prompt or messages", ErrInvalidConfig)
	case p.Prompt != "" && len(p.Messages) != 0:
		return fmt.Errorf("%w: prompt and messages are exclusive", ErrInvalidConfig)
	case len(p.Messages) != 0 && api == APICompletion:
		return fmt.Errorf("%w: messages need the chat API", ErrInvalidConfig)
	case p.MaxTokens < 0:
		return fmt.Errorf("%w: max_tokens must not be negative", ErrInvalidConfig)
	}
	return nil
}

// ReadPrompts reads JSONL: one [Prompt] object per line; blank lines are
// skipped. Errors name the line.
func ReadPrompts(r io.Reader) ([]Prompt, error) {
	var ps []Prompt
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 64<<20)
	for n := 1; sc.Scan(); n++ {
		line := bytes.TrimSpace(sc.Bytes())
		if len(line) == 0 {
			continue
		}
		var p Prompt
		if err := json.Unmarshal(line, &p); err != nil {
			return nil, fmt.Errorf("%w: line %d: %v", ErrInvalidConfig, n, err)
		}
		if p.Prompt == "" && len(p.Messages) == 0 {
			return nil, fmt.Errorf("%w: line %d: want prompt or messages", ErrInvalidConfig, n)
		}
		if bytes.Equal(p.Messages, []byte("null")) {
			p.Messages = nil
		}
		ps = append(ps, p)
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(ps) == 0 {
		return nil, fmt.Errorf("%w: no prompts", ErrInvalidConfig)
	}
	return ps, nil
}

// vocabulary holds the words of synthetic prompts. Distinct random words
// per request defeat prefix caching, as vLLM's random dataset does.
var vocabulary = [...]string{
	"alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel",
	"india", "juliet", "kilo", "lima", "mike", "november", "oscar", "papa",
	"quebec", "romeo", "sierra", "tango", "uniform", "victor", "whiskey", "xray",
	"yankee", "zulu", "red", "green", "blue", "yellow", "orange", "purple",
	"river", "mountain", "forest", "desert", "ocean", "valley", "island", "canyon",
	"apple", "bread", "cheese", "honey", "lemon", "mango", "olive", "pepper",
	"engine", "switch", "signal", "rail", "yard", "train", "track", "station",
	"north", "south", "east", "west", "up", "down", "left", "right",
}

// spec is what request i sends, a pure function of the config and i.
type spec struct {
	prompt       Prompt
	promptTokens int // synthetic prompts only
	maxTokens    int
}

func (c *Config) spec(i int) spec {
	rng := rand.New(rand.NewPCG(c.Seed, uint64(i)))
	var s spec
	if len(c.Prompts) > 0 {
		s.prompt = c.Prompts[i%len(c.Prompts)]
		s.maxTokens = s.prompt.MaxTokens
	} else {
		s.promptTokens = c.PromptTokens.sample(rng.IntN)
	}
	if s.maxTokens == 0 {
		s.maxTokens = c.MaxTokens.sample(rng.IntN)
	}
	if s.promptTokens > 0 {
		b := make([]byte, 0, s.promptTokens*7)
		for w := range s.promptTokens {
			if w > 0 {
				b = append(b, ' ')
			}
			b = append(b, vocabulary[rng.IntN(len(vocabulary))]...)
		}
		s.prompt.Prompt = string(b)
	}
	return s
}

// body encodes the request: always streaming with usage, never ignore_eos,
// so that servers end sequences as they would for a real client.
func (c *Config) body(s spec) []byte {
	b := make([]byte, 0, len(s.prompt.Prompt)+len(s.prompt.Messages)+192)
	b = append(b, `{"model":`...)
	b = appendJSON(b, c.Model)
	if c.API == APICompletion {
		b = append(b, `,"prompt":`...)
		b = appendJSON(b, s.prompt.Prompt)
	} else {
		b = append(b, `,"messages":`...)
		if len(s.prompt.Messages) > 0 {
			b = append(b, s.prompt.Messages...)
		} else {
			b = append(b, `[{"role":"user","content":`...)
			b = appendJSON(b, s.prompt.Prompt)
			b = append(b, `}]`...)
		}
	}
	b = append(b, `,"max_tokens":`...)
	b = strconv.AppendInt(b, int64(s.maxTokens), 10)
	return append(b, `,"stream":true,"stream_options":{"include_usage":true}}`...)
}

func appendJSON(b []byte, s string) []byte {
	j, _ := json.Marshal(s) // a string always encodes
	return append(b, j...)
}
