package openaihttp

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"

	"github.com/switchyard-ai/switchyard/broker"
	"github.com/switchyard-ai/switchyard/oaiformat"
	"github.com/switchyard-ai/switchyard/wire"
)

// apiError is an error in OpenAI's shape with its HTTP status.
type apiError struct {
	Status  int     `json:"-"`
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    *string `json:"code"`
	// RetryAfter, in seconds, for 429 and 503.
	RetryAfter int `json:"-"`
}

func (e *apiError) Error() string { return e.Message }

func strp(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

func invalid(msg, param, code string) *apiError {
	return &apiError{Status: http.StatusBadRequest, Message: msg, Type: "invalid_request_error", Param: strp(param), Code: strp(code)}
}

// fromFormat maps a refusal of oaiformat.Read to a 400 in OpenAI's shape,
// naming the member at fault.
func fromFormat(err error) *apiError {
	var fe *oaiformat.Error
	if errors.As(err, &fe) {
		return invalid(fe.Message, fe.Param, fe.Code)
	}
	return invalid(err.Error(), "", "invalid_request")
}

func writeError(w http.ResponseWriter, e *apiError) {
	h := w.Header()
	h.Set("Content-Type", "application/json")
	if e.RetryAfter > 0 {
		h.Set("Retry-After", strconv.Itoa(e.RetryAfter))
	}
	w.WriteHeader(e.Status)
	_ = json.NewEncoder(w).Encode(struct {
		Error *apiError `json:"error"`
	}{e})
}

// errorEvent renders e as the data of an SSE error event.
func errorEvent(e *apiError) []byte {
	data, _ := json.Marshal(struct {
		Error *apiError `json:"error"`
	}{e})
	return data
}

// fromBroker maps broker and wire errors to HTTP. This is the only place
// where Switchyard errors meet HTTP statuses.
func fromBroker(err error) *apiError {
	var we *wire.Error
	switch {
	case errors.Is(err, broker.ErrNoModel):
		return invalid(err.Error(), "model", "model_required")
	case errors.Is(err, broker.ErrUnknownModel):
		return &apiError{Status: http.StatusNotFound, Message: err.Error(), Type: "invalid_request_error", Param: strp("model"), Code: strp("model_not_found")}
	case errors.Is(err, broker.ErrQueueFull):
		return &apiError{Status: http.StatusTooManyRequests, Message: err.Error(), Type: "rate_limit_error", Code: strp("queue_full"), RetryAfter: 1}
	case errors.Is(err, broker.ErrQueueTimeout):
		return &apiError{Status: http.StatusServiceUnavailable, Message: err.Error(), Type: "server_error", Code: strp("queue_timeout"), RetryAfter: 1}
	case errors.Is(err, broker.ErrNoCapacity):
		return &apiError{Status: http.StatusServiceUnavailable, Message: err.Error(), Type: "server_error", Code: strp("no_capacity"), RetryAfter: 1}
	case errors.Is(err, broker.ErrUnsupported):
		return &apiError{Status: http.StatusServiceUnavailable, Message: err.Error(), Type: "server_error", Code: strp("unsupported"), RetryAfter: 5}
	case errors.Is(err, broker.ErrShutdown):
		return &apiError{Status: http.StatusServiceUnavailable, Message: err.Error(), Type: "server_error", Code: strp("shutdown"), RetryAfter: 1}
	case errors.Is(err, broker.ErrNotConnected), errors.Is(err, broker.ErrClosed):
		return &apiError{Status: http.StatusServiceUnavailable, Message: err.Error(), Type: "server_error", Code: strp("unavailable"), RetryAfter: 1}
	case errors.Is(err, broker.ErrTimeout), errors.Is(err, context.DeadlineExceeded):
		return &apiError{Status: http.StatusGatewayTimeout, Message: err.Error(), Type: "server_error", Code: strp("timeout")}
	case errors.Is(err, broker.ErrAnswerTooLarge):
		return outputTooLarge(err.Error())
	case errors.Is(err, broker.ErrSlowReader):
		return &apiError{Status: http.StatusServiceUnavailable, Message: err.Error(), Type: "server_error", Code: strp("slow_reader")}
	case errors.As(err, &we):
		return fromWire(we)
	}
	return &apiError{Status: http.StatusBadGateway, Message: err.Error(), Type: "server_error", Code: strp("upstream_error")}
}

// outputTooLarge is the 502 of an engine answer larger than the broker
// relays: the engine request is cancelled, and no retry would answer
// differently.
func outputTooLarge(msg string) *apiError {
	return &apiError{Status: http.StatusBadGateway, Message: msg, Type: "server_error", Code: strp(wire.CodeEngineOutputTooLarge)}
}

func fromWire(we *wire.Error) *apiError {
	switch we.GetCode() {
	case wire.CodeBadRequest:
		st := int(we.GetHttpStatus())
		if st < 400 || st > 499 {
			st = http.StatusBadRequest
		}
		return &apiError{Status: st, Message: we.GetMessage(), Type: "invalid_request_error", Code: strp("engine_rejected")}
	case wire.CodeDeadlineExceeded:
		return &apiError{Status: http.StatusGatewayTimeout, Message: we.GetMessage(), Type: "server_error", Code: strp("timeout")}
	case wire.CodeQueueFull:
		return &apiError{Status: http.StatusTooManyRequests, Message: we.GetMessage(), Type: "rate_limit_error", Code: strp("queue_full"), RetryAfter: 1}
	case wire.CodeUnsupportedAPI:
		return &apiError{Status: http.StatusNotImplemented, Message: we.GetMessage(), Type: "invalid_request_error", Code: strp(we.GetCode())}
	case wire.CodeEngineOutputTooLarge:
		return outputTooLarge(we.GetMessage())
	case wire.CodeEngineDown, wire.CodeEngineStalled, wire.CodeDraining, wire.CodeHandoffExpired, wire.CodeEngineMisconfigured:
		// A misconfigured engine is the operator's to fix, never the
		// client's 401: the request was retried, and nobody could serve it.
		return &apiError{Status: http.StatusServiceUnavailable, Message: we.GetMessage(), Type: "server_error", Code: strp(we.GetCode()), RetryAfter: 1}
	}
	return &apiError{Status: http.StatusBadGateway, Message: we.GetMessage(), Type: "server_error", Code: strp(we.GetCode())}
}
