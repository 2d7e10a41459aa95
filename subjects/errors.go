package subjects

import "errors"

var (
	// ErrEmpty is returned when a token to escape is empty: NATS subjects
	// cannot hold empty tokens, and an empty model or agent id is a bug.
	ErrEmpty = errors.New("subjects: empty token")
	// ErrTooLong is returned when an escaped token would exceed MaxTokenLen.
	ErrTooLong = errors.New("subjects: token too long")
	// ErrBadPrefix is returned by New for a prefix that is not a valid
	// subject (empty tokens, wildcards, whitespace).
	ErrBadPrefix = errors.New("subjects: invalid prefix")
	// ErrBadToken is returned when parsing meets a token that is not a valid
	// escaped token.
	ErrBadToken = errors.New("subjects: invalid escaped token")
	// ErrNotMatch is returned when a subject does not have the expected shape.
	ErrNotMatch = errors.New("subjects: subject does not match")
)
