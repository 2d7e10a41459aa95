package simengine

import (
	"errors"
	"fmt"
	"net/http"
)

// ErrInvalidConfig is wrapped by [Config.Validate] errors.
var ErrInvalidConfig = errors.New("simengine: invalid config")

// ErrKVTransfer is wrapped by the *Error of a decode request whose prefill
// hand-off failed: the prefill engine was unreachable, did not know the
// hand-off (never made, expired, already used, or failed), or prefilled
// another prompt; or, with SGLang, the room did not appear in time.
var ErrKVTransfer = errors.New("simengine: KV transfer failed")

// ErrLoading is wrapped by the *Error (503) of every request, and of
// [Engine.Health], while the engine is loading; see [Config.LoadTime].
var ErrLoading = errors.New("simengine: model loading")

// CodeModelLoading is the error code of a request refused while loading.
const CodeModelLoading = "model_loading"

// Error is a request the engine refuses, in the OpenAI error shape. The HTTP
// handler writes it as {"error":{"message","type","param","code"}} with
// Status; empty Param and Code are written as null.
type Error struct {
	Status  int
	Type    string
	Message string
	Param   string
	Code    string

	err error // a sentinel the error matches, or nil
}

func (e *Error) Error() string {
	return fmt.Sprintf("simengine: %d %s: %s", e.Status, e.Type, e.Message)
}

// Unwrap returns the sentinel the error matches, such as [ErrKVTransfer].
func (e *Error) Unwrap() error { return e.err }

// kvTransferError is a decode request's failed hand-off.
func kvTransferError(format string, args ...any) *Error {
	return &Error{
		Status:  http.StatusInternalServerError,
		Type:    "server_error",
		Message: "KV transfer failed: " + fmt.Sprintf(format, args...),
		Code:    CodeKVTransferFailed,
		err:     ErrKVTransfer,
	}
}

func badRequest(param, format string, args ...any) *Error {
	return &Error{
		Status:  http.StatusBadRequest,
		Type:    "invalid_request_error",
		Message: fmt.Sprintf(format, args...),
		Param:   param,
	}
}

func modelNotFound(model string) *Error {
	return &Error{
		Status:  http.StatusNotFound,
		Type:    "invalid_request_error",
		Message: fmt.Sprintf("The model `%s` does not exist.", model),
		Param:   "model",
		Code:    "model_not_found",
	}
}
