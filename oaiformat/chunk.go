package oaiformat

import (
	"bytes"
	"encoding/json"
	"errors"
	"strconv"

	"github.com/switchyard-ai/switchyard/oaiformat/jsonscan"
	"github.com/switchyard-ai/switchyard/wire"
)

// ChunkID returns the "id" of an engine chunk, or "" when it has none or
// the chunk does not decode, as encoding/json reads it (the last member
// named id in any case): one json.Unmarshal into the one field, which
// skips the rest of the chunk.
func ChunkID(raw []byte) string {
	var head struct {
		ID string `json:"id"`
	}
	if json.Unmarshal(raw, &head) != nil {
		return ""
	}
	return head.ID
}

// Reasoning reports whether an engine chunk's first choice carries
// reasoning text (vLLM's and SGLang's delta.reasoning_content, or
// delta.reasoning).
func Reasoning(raw []byte) bool {
	if !bytes.Contains(raw, []byte(`"reasoning`)) {
		return false
	}
	var c struct {
		Choices []struct {
			Delta struct {
				ReasoningContent string `json:"reasoning_content"`
				Reasoning        string `json:"reasoning"`
			} `json:"delta"`
		} `json:"choices"`
	}
	if json.Unmarshal(raw, &c) != nil || len(c.Choices) == 0 {
		return false
	}
	d := c.Choices[0].Delta
	return d.ReasoningContent != "" || d.Reasoning != ""
}

// RewriteChunk returns an engine chunk with its "id" set to id (when id is
// not empty) and, when u is not nil, the token counts of its "usage" set
// to u's; every other member, of the chunk and of its usage
// (prompt_tokens_details, completion_tokens_details...), is kept as the
// engine wrote it. A chunk that is not a JSON object comes back as it was.
func RewriteChunk(raw []byte, id string, u *wire.Usage) []byte {
	if len(raw) == 0 || (id == "" && u == nil) {
		return raw
	}
	out := make([]byte, 0, len(raw)+len(id)+64)
	out = append(out, '{')
	quoted, hasID, hasUsage := false, false, false
	err := jsonscan.Members(raw, func(key []byte, q bool, member, value []byte) {
		if q {
			quoted = true
			return
		}
		if len(out) > 1 {
			out = append(out, ',')
		}
		switch {
		case id != "" && string(key) == "id":
			hasID = true
			out = append(out, `"id":`...)
			out = AppendString(out, id)
		case u != nil && string(key) == "usage":
			hasUsage = true
			out = append(out, `"usage":`...)
			var err error
			if out, err = appendUsage(out, value, u); err != nil {
				quoted = true // a usage key with escapes
			}
		default:
			out = append(out, member...)
		}
	})
	if err != nil {
		return raw
	}
	if quoted {
		return rewriteChunkDecoded(raw, id, u)
	}
	// A member added to an empty object ({}) takes no comma before it.
	if id != "" && !hasID {
		if len(out) > 1 {
			out = append(out, ',')
		}
		out = append(out, `"id":`...)
		out = AppendString(out, id)
	}
	if u != nil && !hasUsage {
		if len(out) > 1 {
			out = append(out, ',')
		}
		out = append(out, `"usage":`...)
		out, _ = appendUsage(out, nil, u)
	}
	return append(out, '}')
}

// appendUsage appends the usage object old (a JSON value, or nil) with
// its three counts set to u's.
func appendUsage(out, old []byte, u *wire.Usage) ([]byte, error) {
	counts := func(out []byte) []byte {
		out = append(out, `"prompt_tokens":`...)
		out = strconv.AppendUint(out, uint64(u.GetPromptTokens()), 10)
		out = append(out, `,"completion_tokens":`...)
		out = strconv.AppendUint(out, uint64(u.GetCompletionTokens()), 10)
		out = append(out, `,"total_tokens":`...)
		return strconv.AppendUint(out, uint64(u.GetTotalTokens()), 10)
	}
	if len(old) == 0 || old[0] != '{' {
		return append(counts(append(out, '{')), '}'), nil
	}
	out = counts(append(out, '{'))
	quoted := false
	err := jsonscan.Members(old, func(key []byte, q bool, member, _ []byte) {
		if q {
			quoted = true
			return
		}
		switch string(key) {
		case "prompt_tokens", "completion_tokens", "total_tokens":
			return
		}
		out = append(out, ',')
		out = append(out, member...)
	})
	if err == nil && quoted {
		err = errQuoted
	}
	return append(out, '}'), err
}

var errQuoted = errors.New("usage key with escapes")

// rewriteChunkDecoded is RewriteChunk through encoding/json, for chunks
// whose keys need unquoting.
func rewriteChunkDecoded(raw []byte, id string, u *wire.Usage) []byte {
	var m map[string]json.RawMessage
	if json.Unmarshal(raw, &m) != nil || m == nil {
		return raw
	}
	if id != "" {
		m["id"] = AppendString(nil, id)
	}
	if u != nil {
		var um map[string]json.RawMessage
		if json.Unmarshal(m["usage"], &um) != nil || um == nil {
			um = map[string]json.RawMessage{}
		}
		um["prompt_tokens"] = strconv.AppendUint(nil, uint64(u.GetPromptTokens()), 10)
		um["completion_tokens"] = strconv.AppendUint(nil, uint64(u.GetCompletionTokens()), 10)
		um["total_tokens"] = strconv.AppendUint(nil, uint64(u.GetTotalTokens()), 10)
		m["usage"], _ = json.Marshal(um)
	}
	out, err := json.Marshal(m)
	if err != nil {
		return raw
	}
	return out
}

// Usage returns the "usage" object of the engine chunk raw with its three
// counts set to u's and its other members (prompt_tokens_details,
// completion_tokens_details.reasoning_tokens...) as the engine wrote them;
// with no usage object in raw, an object of the three counts.
func Usage(raw []byte, u *wire.Usage) json.RawMessage {
	if u == nil {
		u = &wire.Usage{}
	}
	var old []byte
	quoted := false
	_ = jsonscan.Members(raw, func(key []byte, q bool, _, value []byte) {
		if q {
			quoted = true
		} else if string(key) == "usage" {
			old = value
		}
	})
	if !quoted {
		if out, err := appendUsage(nil, old, u); err == nil {
			return out
		}
	}
	var m map[string]json.RawMessage
	if json.Unmarshal(raw, &m) == nil {
		if v := m["usage"]; len(v) > 0 {
			full := rewriteChunkDecoded([]byte(`{"usage":`+string(v)+`}`), "", u)
			var w struct{ Usage json.RawMessage }
			if json.Unmarshal(full, &w) == nil && len(w.Usage) > 0 {
				return w.Usage
			}
		}
	}
	out, _ := appendUsage(nil, nil, u)
	return out
}

// PrefilledTokens returns the prompt tokens an engine prefilled for the
// answer or usage chunk raw: its usage's prompt_tokens less
// prompt_tokens_details.cached_tokens (OpenAI's field, which vLLM fills
// with --enable-prompt-tokens-details and SGLang with
// --enable-cache-report), or SGLang's meta_info.prompt_tokens less
// meta_info.cached_tokens. ok is false when raw reports no cached tokens:
// what the engine prefilled is then not known.
func PrefilledTokens(raw []byte) (n int, ok bool) {
	if len(raw) == 0 {
		return 0, false
	}
	var v struct {
		Usage *struct {
			PromptTokens  int `json:"prompt_tokens"`
			PromptDetails *struct {
				CachedTokens *int `json:"cached_tokens"`
			} `json:"prompt_tokens_details"`
		} `json:"usage"`
		MetaInfo *struct {
			PromptTokens int  `json:"prompt_tokens"`
			CachedTokens *int `json:"cached_tokens"`
		} `json:"meta_info"`
	}
	if json.Unmarshal(raw, &v) != nil {
		return 0, false
	}
	switch {
	case v.Usage != nil && v.Usage.PromptDetails != nil && v.Usage.PromptDetails.CachedTokens != nil:
		return max(v.Usage.PromptTokens-*v.Usage.PromptDetails.CachedTokens, 0), true
	case v.MetaInfo != nil && v.MetaInfo.CachedTokens != nil:
		return max(v.MetaInfo.PromptTokens-*v.MetaInfo.CachedTokens, 0), true
	}
	return 0, false
}
