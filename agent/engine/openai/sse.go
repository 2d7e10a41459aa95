package openai

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"sync"

	"github.com/switchyard-ai/switchyard/agent"
	"github.com/switchyard-ai/switchyard/oaiformat/sse"
	"github.com/switchyard-ai/switchyard/wire"
)

// sseBufferSize is the size of the connection's own read buffer, as large
// as the SSE reader's.
const sseBufferSize = sse.DefaultBufferSize

// sseReaders keeps SSE readers between answers.
var sseReaders = sync.Pool{New: func() any { return sse.NewReader(nil, 0) }}

// ReadSSE calls emit with the data of each server-sent event until
// "data: [DONE]" or the end of the body, as the adapter reads an engine's
// answer (a line or event longer than DefaultMaxEvent ends it with an
// error), through the project's SSE reader (oaiformat/sse): data lines
// joined with \n, other fields and comments skipped, an event with empty
// data skipped. An error event (an object with an "error" member, as vLLM
// sends mid-stream) ends the stream with that error, and so does a body
// that ends before [DONE]; a last "data: [DONE]" without its empty line
// ends it well. emit's more is true when the next whole event is already
// read, so a burst of events that arrived together can travel on as one
// message.
func ReadSSE(body io.Reader, emit agent.Emit) error {
	return readSSE(body, DefaultMaxEvent, "", emit)
}

// readSSE is ReadSSE with a bound on lines and events, max bytes, and the
// engine's name for the error that bound makes.
func readSSE(body io.Reader, max int, engine string, emit agent.Emit) error {
	r := sseReaders.Get().(*sse.Reader)
	r.Reset(body, max)
	defer func() {
		r.Reset(nil, 0)
		sseReaders.Put(r)
	}()
	for {
		ev, err := r.Next()
		switch {
		case err == nil:
		case errors.Is(err, sse.ErrLineTooLong):
			return tooLarge(engine, "line", max)
		case errors.Is(err, sse.ErrEventTooLarge):
			return tooLarge(engine, "event", max)
		case errors.Is(err, io.ErrUnexpectedEOF) && bytes.Equal(ev.Data, doneData):
			return nil // "data: [DONE]" without its empty line
		case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
			return &wire.Error{Code: wire.CodeEngine, Message: "engine closed the stream before [DONE]"}
		default:
			return &wire.Error{Code: wire.CodeEngine, Message: "reading engine stream: " + err.Error()}
		}
		switch {
		case len(ev.Data) == 0:
			continue
		case bytes.Equal(ev.Data, doneData):
			return nil
		}
		if e := eventError(ev.Data); e != nil {
			return e
		}
		if err := emit(ev.Data, r.EventAhead()); err != nil {
			return err
		}
	}
}

var doneData = []byte("[DONE]")

// tooLarge is the error of an engine answer that breaks the bound on an
// SSE line or event: not retryable, since any engine would answer the
// same request alike, and the stream cannot carry it.
func tooLarge(engine, what string, max int) *wire.Error {
	msg := fmt.Sprintf("SSE %s exceeds %d bytes", what, max)
	if what == "answer" {
		msg = fmt.Sprintf("answer exceeds %d bytes", max)
	}
	if engine != "" {
		msg = "engine " + engine + ": " + msg
	}
	return &wire.Error{Code: wire.CodeEngineOutputTooLarge, Message: msg}
}
