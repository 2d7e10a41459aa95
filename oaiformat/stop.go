package oaiformat

import (
	"bytes"
	"encoding/json"
	"errors"
)

var errStop = errors.New("stop must be a string or an array of strings")

// Stops reads a request's "stop" member: null or absent, a string, or an
// array of strings. Empty strings stop nothing and are left out; nil means
// no stop strings.
func Stops(raw json.RawMessage) ([]string, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return nil, nil
	}
	if raw[0] == '"' {
		var s string
		if json.Unmarshal(raw, &s) != nil {
			return nil, errStop
		}
		if s == "" {
			return nil, nil
		}
		return []string{s}, nil
	}
	var list []string
	if json.Unmarshal(raw, &list) != nil {
		return nil, errStop
	}
	out := list[:0]
	for _, s := range list {
		if s != "" {
			out = append(out, s)
		}
	}
	if len(out) == 0 {
		return nil, nil
	}
	return out, nil
}
