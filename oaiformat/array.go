package oaiformat

import (
	"bytes"
	"encoding/json"
	"errors"
)

// ErrTooManyElements is returned by Elements for an array longer than its
// bound.
var ErrTooManyElements = errors.New("array has too many elements")

// Elements calls fn with each element of the JSON array raw, in order,
// and stops with ErrTooManyElements at element max+1: a bound on an
// array's length costs at most max elements' decoding, however long the
// array is. raw must be a valid JSON array.
func Elements(raw json.RawMessage, max int, fn func(i int, elem json.RawMessage) error) error {
	dec := json.NewDecoder(bytes.NewReader(raw))
	if _, err := dec.Token(); err != nil {
		return err
	}
	for i := 0; dec.More(); i++ {
		if i == max {
			return ErrTooManyElements
		}
		var e json.RawMessage
		if err := dec.Decode(&e); err != nil {
			return err
		}
		if err := fn(i, e); err != nil {
			return err
		}
	}
	return nil
}
