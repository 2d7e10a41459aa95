package subjects

import "fmt"

const hexDigits = "0123456789ABCDEF"

// plain reports whether c passes through escaping unchanged.
func plain(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-'
}

// Escape maps any non-empty string to one subject token made only of
// [A-Za-z0-9_-]. Bytes other than letters, digits and '-' become "_XX"
// (upper-case hex), '_' included, which makes the mapping injective.
func Escape(s string) (string, error) {
	if s == "" {
		return "", ErrEmpty
	}
	n := 0
	for i := 0; i < len(s); i++ {
		if plain(s[i]) {
			n++
		} else {
			n += 3
		}
	}
	if n > MaxTokenLen {
		return "", fmt.Errorf("%w: %d bytes escaped, max %d", ErrTooLong, n, MaxTokenLen)
	}
	if n == len(s) {
		return s, nil
	}
	out := make([]byte, 0, n)
	for i := 0; i < len(s); i++ {
		c := s[i]
		if plain(c) {
			out = append(out, c)
			continue
		}
		out = append(out, '_', hexDigits[c>>4], hexDigits[c&0xF])
	}
	return string(out), nil
}

// Unescape reverses Escape. It accepts only the canonical form Escape
// produces (upper-case hex, no escaped plain bytes), so every token has
// exactly one preimage.
func Unescape(tok string) (string, error) {
	if tok == "" {
		return "", ErrEmpty
	}
	if len(tok) > MaxTokenLen {
		return "", fmt.Errorf("%w: %d bytes, max %d", ErrTooLong, len(tok), MaxTokenLen)
	}
	esc := false
	for i := 0; i < len(tok); i++ {
		if tok[i] == '_' {
			esc = true
		} else if !plain(tok[i]) {
			return "", fmt.Errorf("%w: byte %q in %q", ErrBadToken, tok[i], tok)
		}
	}
	if !esc {
		return tok, nil
	}
	out := make([]byte, 0, len(tok))
	for i := 0; i < len(tok); i++ {
		c := tok[i]
		if c != '_' {
			out = append(out, c)
			continue
		}
		if i+2 >= len(tok) {
			return "", fmt.Errorf("%w: truncated escape in %q", ErrBadToken, tok)
		}
		hi, ok1 := unhex(tok[i+1])
		lo, ok2 := unhex(tok[i+2])
		if !ok1 || !ok2 {
			return "", fmt.Errorf("%w: bad escape in %q", ErrBadToken, tok)
		}
		v := hi<<4 | lo
		if plain(v) {
			return "", fmt.Errorf("%w: non-canonical escape of %q in %q", ErrBadToken, v, tok)
		}
		out = append(out, v)
		i += 2
	}
	return string(out), nil
}

func unhex(c byte) (byte, bool) {
	switch {
	case c >= '0' && c <= '9':
		return c - '0', true
	case c >= 'A' && c <= 'F':
		return c - 'A' + 10, true
	}
	return 0, false
}
