package vllmgrpc

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"strings"

	"github.com/switchyard-ai/switchyard/oaiformat"
	"github.com/switchyard-ai/switchyard/vllmpb"
	"github.com/switchyard-ai/switchyard/wire"
)

// Message is one chat message as the chat template sees it.
type Message struct {
	Role    string
	Content string
}

// ChatTemplate renders chat messages to the prompt text sent to the engine.
// continueFinal is the request's continue_final_message: the last message
// is an assistant message to continue, not to close.
type ChatTemplate func(msgs []Message, continueFinal bool) (string, error)

// SimpleChatTemplate is the default template, the one the Switchyard
// simulator applies over HTTP: "role: content\n" per message, then
// "assistant:"; with continueFinal and a final assistant message, that
// message is rendered as "assistant: content" and nothing follows. vLLM's
// gRPC service takes text (or token ids) and applies no chat template, so a
// real model needs WithChatTemplate with its own template.
func SimpleChatTemplate(msgs []Message, continueFinal bool) (string, error) {
	if len(msgs) == 0 {
		return "", badRequest("messages must be a non-empty array")
	}
	var sb strings.Builder
	last := len(msgs) - 1
	cont := continueFinal && msgs[last].Role == "assistant"
	for i, m := range msgs {
		sb.WriteString(m.Role)
		sb.WriteString(": ")
		sb.WriteString(m.Content)
		if i == last && cont {
			return sb.String(), nil
		}
		sb.WriteByte('\n')
	}
	sb.WriteString("assistant:")
	return sb.String(), nil
}

func badRequest(format string, args ...any) *wire.Error {
	return &wire.Error{Code: wire.CodeBadRequest, Message: fmt.Sprintf(format, args...), HttpStatus: 400}
}

// body is the union of the OpenAI chat and completion fields the adapter
// maps; every other field is ignored, as vLLM ignores unknown fields.
type body struct {
	Model    string `json:"model"`
	Messages []struct {
		Role    string          `json:"role"`
		Content json.RawMessage `json:"content"`
	} `json:"messages"`
	ContinueFinalMessage bool            `json:"continue_final_message"`
	Prompt               json.RawMessage `json:"prompt"`

	MaxTokens           *int64          `json:"max_tokens"`
	MaxCompletionTokens *int64          `json:"max_completion_tokens"`
	MinTokens           *int64          `json:"min_tokens"`
	Temperature         *float64        `json:"temperature"`
	TopP                *float64        `json:"top_p"`
	TopK                *int64          `json:"top_k"`
	MinP                *float64        `json:"min_p"`
	FrequencyPenalty    *float64        `json:"frequency_penalty"`
	PresencePenalty     *float64        `json:"presence_penalty"`
	RepetitionPenalty   *float64        `json:"repetition_penalty"`
	Seed                *int64          `json:"seed"`
	Stop                json.RawMessage `json:"stop"`
	StopTokenIDs        []uint32        `json:"stop_token_ids"`
	IgnoreEOS           bool            `json:"ignore_eos"`
	N                   *int64          `json:"n"`
	Logprobs            json.RawMessage `json:"logprobs"`
}

// job is a request body turned into what Generate needs.
type job struct {
	model string
	req   *vllmpb.GenerateRequest
	stops []string
}

// buildRequest maps an OpenAI body to a GenerateRequest. Errors are
// *wire.Error with CodeBadRequest.
func buildRequest(api wire.API, raw []byte, tmpl ChatTemplate) (*job, error) {
	var b body
	if err := json.Unmarshal(raw, &b); err != nil {
		return nil, badRequest("invalid request body: %v", err)
	}
	req := &vllmpb.GenerateRequest{Stream: true}
	limit, limitName := b.MaxTokens, "max_tokens"
	switch api {
	case wire.API_API_CHAT:
		msgs := make([]Message, 0, len(b.Messages))
		for i, m := range b.Messages {
			if m.Role == "" {
				return nil, badRequest("messages[%d].role is required", i)
			}
			c, err := content(i, m.Content)
			if err != nil {
				return nil, err
			}
			msgs = append(msgs, Message{Role: m.Role, Content: c})
		}
		if len(msgs) == 0 {
			return nil, badRequest("messages must be a non-empty array")
		}
		text, err := tmpl(msgs, b.ContinueFinalMessage)
		if err != nil {
			return nil, err
		}
		req.Input = &vllmpb.GenerateRequest_Text{Text: text}
		if b.MaxCompletionTokens != nil {
			limit, limitName = b.MaxCompletionTokens, "max_completion_tokens"
		}
	case wire.API_API_COMPLETION:
		if err := setPrompt(req, b.Prompt); err != nil {
			return nil, err
		}
	default:
		return nil, badRequest("unsupported api %v", api)
	}

	sp := &vllmpb.SamplingParams{
		N:                          1,
		TopP:                       1,
		RepetitionPenalty:          1,
		SkipSpecialTokens:          true,
		SpacesBetweenSpecialTokens: true,
		IgnoreEos:                  b.IgnoreEOS,
		StopTokenIds:               b.StopTokenIDs,
	}
	if b.N != nil && *b.N != 1 {
		return nil, badRequest("n must be 1 over vllm-grpc, got %d", *b.N)
	}
	if l := bytes.TrimSpace(b.Logprobs); len(l) > 0 && !bytes.Equal(l, []byte("null")) && !bytes.Equal(l, []byte("false")) {
		return nil, badRequest("logprobs are not supported over vllm-grpc")
	}
	if limit != nil {
		if *limit < 1 || *limit > math.MaxUint32 {
			return nil, badRequest("%s must be at least 1, got %d", limitName, *limit)
		}
		m := uint32(*limit)
		sp.MaxTokens = &m
	}
	if b.MinTokens != nil {
		if *b.MinTokens < 0 || *b.MinTokens > math.MaxUint32 {
			return nil, badRequest("min_tokens must not be negative, got %d", *b.MinTokens)
		}
		sp.MinTokens = uint32(*b.MinTokens)
	}
	if b.Temperature != nil {
		t := float32(*b.Temperature)
		sp.Temperature = &t
	}
	if b.TopP != nil {
		sp.TopP = float32(*b.TopP)
	}
	if b.TopK != nil {
		if *b.TopK > 0 && *b.TopK <= math.MaxUint32 {
			sp.TopK = uint32(*b.TopK) // 0 and -1 both mean "off"
		}
	}
	if b.MinP != nil {
		sp.MinP = float32(*b.MinP)
	}
	if b.FrequencyPenalty != nil {
		sp.FrequencyPenalty = float32(*b.FrequencyPenalty)
	}
	if b.PresencePenalty != nil {
		sp.PresencePenalty = float32(*b.PresencePenalty)
	}
	if b.RepetitionPenalty != nil {
		sp.RepetitionPenalty = float32(*b.RepetitionPenalty)
	}
	if b.Seed != nil {
		if *b.Seed < math.MinInt32 || *b.Seed > math.MaxInt32 {
			return nil, badRequest("seed %d does not fit the engine's int32", *b.Seed)
		}
		s := int32(*b.Seed)
		sp.Seed = &s
	}
	stops, err := oaiformat.Stops(b.Stop)
	if err != nil {
		return nil, badRequest("%v", err)
	}
	sp.Stop = stops
	req.SamplingParams = sp
	return &job{model: b.Model, req: req, stops: stops}, nil
}

func content(i int, raw json.RawMessage) (string, error) {
	if isNull(raw) {
		return "", nil
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s, nil
	}
	var parts []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	if json.Unmarshal(raw, &parts) != nil {
		return "", badRequest("messages[%d].content must be a string or an array of text parts", i)
	}
	var sb strings.Builder
	for _, p := range parts {
		if p.Type != "text" {
			return "", badRequest("messages[%d].content: part type %q is not supported over vllm-grpc", i, p.Type)
		}
		sb.WriteString(p.Text)
	}
	return sb.String(), nil
}

// setPrompt maps a completion prompt: a string or one string is text, an
// array of token ids is a tokenized input.
func setPrompt(req *vllmpb.GenerateRequest, raw json.RawMessage) error {
	if isNull(raw) {
		return badRequest("prompt is required")
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		req.Input = &vllmpb.GenerateRequest_Text{Text: s}
		return nil
	}
	var list []string
	if json.Unmarshal(raw, &list) == nil {
		if len(list) != 1 {
			return badRequest("prompt must be a string or an array of one string, got %d strings", len(list))
		}
		req.Input = &vllmpb.GenerateRequest_Text{Text: list[0]}
		return nil
	}
	var ids []uint32
	if json.Unmarshal(raw, &ids) == nil && len(ids) > 0 {
		req.Input = &vllmpb.GenerateRequest_Tokenized{Tokenized: &vllmpb.TokenizedInput{InputIds: ids}}
		return nil
	}
	return badRequest("prompt must be a string, an array of one string or an array of token ids")
}

func isNull(raw json.RawMessage) bool {
	raw = bytes.TrimSpace(raw)
	return len(raw) == 0 || bytes.Equal(raw, []byte("null"))
}
