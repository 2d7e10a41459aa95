package oaiformat

import "errors"

// An Error is a request the format refuses, in the terms of OpenAI's error
// object; the ingresses map it to HTTP 400 or gRPC INVALID_ARGUMENT.
type Error struct {
	Message string
	Param   string // the member at fault, when there is one
	Code    string // e.g. "invalid_value", "invalid_type", "reserved_field"
}

func (e *Error) Error() string { return e.Message }

func invalid(msg, param, code string) *Error {
	return &Error{Message: msg, Param: param, Code: code}
}

// ErrNotObject is wrapped by the body builders for a body that is not one
// JSON object.
var ErrNotObject = errors.New("request body is not a JSON object")
