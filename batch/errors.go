package batch

import "errors"

var (
	// ErrNotFound: no such file or batch for this owner (another key's
	// objects are not found either).
	ErrNotFound = errors.New("batch: not found")
	// ErrInvalid wraps a refusal of a client's parameters; *InvalidError
	// names the parameter.
	ErrInvalid = errors.New("batch: invalid request")
	// ErrTooLarge: an upload larger than the file size limit.
	ErrTooLarge = errors.New("batch: file too large")
	// ErrUnavailable: the buckets cannot be reached or created now.
	ErrUnavailable = errors.New("batch: storage unavailable")
)

// InvalidError is a refused parameter.
type InvalidError struct {
	Param   string
	Message string
}

func (e *InvalidError) Error() string { return e.Message }

// Is makes an InvalidError match ErrInvalid.
func (e *InvalidError) Is(target error) bool { return target == ErrInvalid }

func invalid(param, msg string) error { return &InvalidError{Param: param, Message: msg} }
