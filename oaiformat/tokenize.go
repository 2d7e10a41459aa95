package oaiformat

import (
	"encoding/json"
	"errors"
	"strings"
	"unicode/utf8"

	"github.com/switchyard-ai/switchyard/wire"
)

// TokenizeRequest is vLLM's POST /tokenize body. Its completion form has
// Prompt; its chat form has Messages, rendered with the engine's chat
// template (and Tools, ChatTemplate, ChatTemplateKwargs, as a chat
// completion would pass them) before tokenizing.
type TokenizeRequest struct {
	Model                string          `json:"model,omitempty"`
	Prompt               *string         `json:"prompt,omitempty"`
	Messages             json.RawMessage `json:"messages,omitempty"`
	AddSpecialTokens     *bool           `json:"add_special_tokens,omitempty"`
	AddGenerationPrompt  *bool           `json:"add_generation_prompt,omitempty"`
	ContinueFinalMessage bool            `json:"continue_final_message,omitempty"`
	ReturnTokenStrs      bool            `json:"return_token_strs,omitempty"`
	Tools                json.RawMessage `json:"tools,omitempty"`
	ChatTemplate         json.RawMessage `json:"chat_template,omitempty"`
	ChatTemplateKwargs   json.RawMessage `json:"chat_template_kwargs,omitempty"`
}

// TokenizeResponse is vLLM's /tokenize answer. TokenStrs, when asked for,
// are the tokenizer's vocabulary strings (convert_ids_to_tokens), not
// decoded text: see [TokenText].
type TokenizeResponse struct {
	Count       int      `json:"count"`
	MaxModelLen int      `json:"max_model_len"`
	Tokens      []uint32 `json:"tokens"`
	TokenStrs   []string `json:"token_strs,omitempty"`
}

// errNoPrompt: the request has no prompt to tokenize.
var errNoPrompt = errors.New("no text prompt to tokenize")

// TokenizeBody returns the /tokenize body that tokenizes a validated
// request's prompt as the engine runs it, with token strings: a chat's
// messages with the fields that shape its template, or a completion's
// text prompt.
func TokenizeBody(api wire.API, body []byte) ([]byte, error) {
	var b struct {
		Model                string          `json:"model"`
		Messages             json.RawMessage `json:"messages"`
		Prompt               json.RawMessage `json:"prompt"`
		AddSpecialTokens     *bool           `json:"add_special_tokens"`
		AddGenerationPrompt  *bool           `json:"add_generation_prompt"`
		ContinueFinalMessage bool            `json:"continue_final_message"`
		Tools                json.RawMessage `json:"tools"`
		ChatTemplate         json.RawMessage `json:"chat_template"`
		ChatTemplateKwargs   json.RawMessage `json:"chat_template_kwargs"`
	}
	if err := json.Unmarshal(body, &b); err != nil {
		return nil, err
	}
	t := TokenizeRequest{Model: b.Model, AddSpecialTokens: b.AddSpecialTokens, ReturnTokenStrs: true}
	switch api {
	case wire.API_API_CHAT:
		if isNullJSON(b.Messages) {
			return nil, errNoPrompt
		}
		t.Messages, t.AddGenerationPrompt, t.ContinueFinalMessage = b.Messages, b.AddGenerationPrompt, b.ContinueFinalMessage
		t.Tools, t.ChatTemplate, t.ChatTemplateKwargs = nonNull(b.Tools), nonNull(b.ChatTemplate), nonNull(b.ChatTemplateKwargs)
	case wire.API_API_COMPLETION:
		p, ok := PromptOf(api, body)
		if !ok {
			return nil, errNoPrompt
		}
		t.Prompt = &p.Text
	default:
		return nil, errNoPrompt
	}
	return json.Marshal(t)
}

func isNullJSON(raw json.RawMessage) bool {
	s := strings.TrimSpace(string(raw))
	return s == "" || s == "null"
}

func nonNull(raw json.RawMessage) json.RawMessage {
	if isNullJSON(raw) {
		return nil
	}
	return raw
}

// byteLevel maps a byte to its rune in byte-level BPE vocabularies
// (GPT-2's bytes_to_unicode: printable Latin-1 bytes stand for
// themselves, the others for U+0100 on, so " " is "Ġ" and "\n" is "Ċ").
// byteOf is its inverse, -1 for runes that stand for no byte.
var byteLevel, byteOf = func() ([256]rune, [324]int16) {
	var fwd [256]rune
	var inv [324]int16
	for i := range inv {
		inv[i] = -1
	}
	n := 0
	for b := range 256 {
		if ('!' <= b && b <= '~') || (0xA1 <= b && b <= 0xAC) || (0xAE <= b && b <= 0xFF) {
			fwd[b] = rune(b)
		} else {
			fwd[b] = rune(256 + n)
			n++
		}
		inv[fwd[b]] = int16(b)
	}
	return fwd, inv
}()

// ByteLevelTokenStr returns token bytes b as a byte-level BPE vocabulary
// spells them, which is what /tokenize's token_strs holds for such
// tokenizers (GPT-2, Llama 3, Qwen).
func ByteLevelTokenStr(b []byte) string {
	var sb strings.Builder
	for _, c := range b {
		sb.WriteRune(byteLevel[c])
	}
	return sb.String()
}

// tokenStrForm is how a tokenizer spells its vocabulary.
type tokenStrForm uint8

const (
	formPlain     tokenStrForm = iota
	formByteLevel              // "Ġword", "Ċ"
	formPiece                  // SentencePiece: "▁word", "<0x0A>"
)

// formOf tells a vocabulary's spelling from a prompt's token strings: a
// byte-level one remaps the space and the newline, which nearly every
// prompt holds; SentencePiece writes "▁" for the space.
func formOf(strs []string) tokenStrForm {
	piece := false
	for _, s := range strs {
		for _, r := range s {
			switch {
			case r >= 0x100 && r < 0x144:
				return formByteLevel
			case r == '▁':
				piece = true
			}
		}
	}
	if piece {
		return formPiece
	}
	return formPlain
}

// TokenText appends the text of the tokens strs spells (token_strs of a
// /tokenize answer) to dst, and to ends the offset in dst just past each
// token. A byte-level token stands for its bytes (a character may be
// split between two tokens); a SentencePiece "▁" is a space and "<0xNN>"
// a byte; a special token ("<|im_start|>") stands for its spelling,
// which a prompt's text never holds.
func TokenText(dst []byte, ends []int, strs []string) ([]byte, []int) {
	form := formOf(strs)
	for _, s := range strs {
		switch form {
		case formByteLevel:
			dst = appendByteLevel(dst, s)
		case formPiece:
			if len(s) == 6 && strings.HasPrefix(s, "<0x") && s[5] == '>' {
				if b, ok := hexByte(s[3], s[4]); ok {
					dst = append(dst, b)
					break
				}
			}
			dst = append(dst, strings.ReplaceAll(s, "▁", " ")...)
		default:
			dst = append(dst, s...)
		}
		ends = append(ends, len(dst))
	}
	return dst, ends
}

// appendByteLevel appends the bytes s stands for, or s itself when some
// rune of it stands for no byte (an added token outside the alphabet).
func appendByteLevel(dst []byte, s string) []byte {
	start := len(dst)
	for _, r := range s {
		if r < 0 || int(r) >= len(byteOf) || byteOf[r] < 0 || r == utf8.RuneError {
			return append(dst[:start], s...)
		}
		dst = append(dst, byte(byteOf[r]))
	}
	return dst
}

func hexByte(a, b byte) (byte, bool) {
	h, ok1 := hexDigit(a)
	l, ok2 := hexDigit(b)
	return h<<4 | l, ok1 && ok2
}

func hexDigit(c byte) (byte, bool) {
	switch {
	case '0' <= c && c <= '9':
		return c - '0', true
	case 'a' <= c && c <= 'f':
		return c - 'a' + 10, true
	case 'A' <= c && c <= 'F':
		return c - 'A' + 10, true
	}
	return 0, false
}
