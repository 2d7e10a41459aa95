package simengine

import (
	"errors"
	"fmt"
	"net/http"
)

// ErrInvalidConfig is wrapped by [Config.Validate] errors.
var ErrInvalidConfig = errors.New("simengine: invalid config")

// Error is a request the engine refuses, in the OpenAI error shape. The HTTP
// handler writes it as {"error":{"message","type","param","code"}} with
// Status; empty Param and Code are written as null.
type Error struct {
	Status  int
	Type    string
	Message string
	Param   string
	Code    string
}

func (e *Error) Error() string {
	return fmt.Sprintf("simengine: %d %s: %s", e.Status, e.Type, e.Message)
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
