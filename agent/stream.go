package agent

import (
	"encoding/json"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/switchyard-ai/switchyard/wire"
)

// stream sends the chunks of one attempt with strictly increasing sequence
// numbers. Core NATS keeps the order of one connection's publishes, so the
// broker sees them in order unless one is lost, which the sequence exposes.
type stream struct {
	a            *Agent
	job          *wire.Job
	seq          uint64
	buf          []byte
	usage        *wire.Usage
	usageRaw     []byte
	finishReason string
	tokens       int
	ended        bool
	stage        wire.Chunk_Stage
	called       time.Time // when the engine was called

	// acked, when set, yields the result of the job's ack (and its
	// accepted chunk); waitAck reads it once.
	acked   chan error
	ackErr  error
	ackRead bool
}

// waitAck blocks until the job's ack is confirmed (or failed). Everything
// after the accepted chunk waits for it, so the sequence stays in order and
// an agent that lost the job to another never speaks for it.
func (s *stream) waitAck() error {
	if s.acked == nil || s.ackRead {
		return s.ackErr
	}
	s.ackErr = <-s.acked
	s.ackRead = true
	return s.ackErr
}

func newStream(a *Agent, job *wire.Job) *stream {
	return &stream{a: a, job: job, buf: make([]byte, 0, 512)}
}

func (s *stream) send(c *wire.Chunk) error {
	c.RequestId = s.job.GetRequestId()
	c.Attempt = s.job.GetAttempt()
	c.Seq = s.seq
	c.AgentId = s.a.cfg.ID
	c.Stage = s.stage
	s.seq++
	var err error
	s.buf, err = proto.MarshalOptions{}.MarshalAppend(s.buf[:0], c)
	if err != nil {
		return err
	}
	// Publish copies into the connection's buffer, so buf is reusable.
	return s.a.nc.Publish(s.job.GetReplySubject(), s.buf)
}

// engineChunk is the part of an OpenAI streaming chunk the broker needs
// parsed; everything else travels in Chunk.raw untouched.
type engineChunk struct {
	Choices []struct {
		Text  string `json:"text"`
		Delta struct {
			Content string `json:"content"`
		} `json:"delta"`
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
	Usage *struct {
		PromptTokens     uint32 `json:"prompt_tokens"`
		CompletionTokens uint32 `json:"completion_tokens"`
		TotalTokens      uint32 `json:"total_tokens"`
	} `json:"usage"`
}

// emit is the Engine's callback for one engine chunk.
func (s *stream) emit(raw []byte) error {
	if err := s.waitAck(); err != nil {
		return err
	}
	var ec engineChunk
	if err := json.Unmarshal(raw, &ec); err != nil {
		return &wire.Error{Code: wire.CodeEngine, Message: "engine sent an undecodable chunk: " + err.Error()}
	}
	if ec.Usage != nil {
		s.usage = &wire.Usage{PromptTokens: ec.Usage.PromptTokens, CompletionTokens: ec.Usage.CompletionTokens, TotalTokens: ec.Usage.TotalTokens}
	}
	if len(ec.Choices) == 0 {
		// The usage chunk: held for the final message, where the broker
		// passes it on only if the client asked for usage.
		if ec.Usage != nil {
			s.usageRaw = append(s.usageRaw[:0], raw...)
		}
		return nil
	}
	c := &wire.Chunk{Kind: wire.Chunk_KIND_TOKEN, Raw: raw}
	ch := ec.Choices[0]
	c.DeltaText = ch.Delta.Content + ch.Text
	if ch.FinishReason != nil {
		c.FinishReason = *ch.FinishReason
		s.finishReason = *ch.FinishReason
	}
	if c.DeltaText != "" {
		if s.tokens == 0 && !s.called.IsZero() {
			s.a.metrics.ttft.Observe(time.Since(s.called).Seconds())
		}
		s.tokens++
	}
	return s.send(c)
}

func (s *stream) finish() {
	if s.ended {
		return
	}
	s.ended = true
	if err := s.send(&wire.Chunk{Kind: wire.Chunk_KIND_FINAL, Raw: s.usageRaw, FinishReason: s.finishReason, Usage: s.usage}); err != nil {
		s.a.log.Warn("final chunk not sent", "request", s.job.GetRequestId(), "err", err)
	}
}

func (s *stream) fail(e *wire.Error) {
	if s.ended {
		return
	}
	s.ended = true
	if err := s.send(&wire.Chunk{Kind: wire.Chunk_KIND_ERROR, Error: e}); err != nil {
		s.a.log.Warn("error chunk not sent", "request", s.job.GetRequestId(), "err", err)
	}
}
