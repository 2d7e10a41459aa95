package auth

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"os"
	"strings"
)

// ErrBadKey is wrapped by LoadKeys errors about a key or the key file.
var ErrBadKey = errors.New("auth: bad API key")

// Keys is a set of accepted API keys. A nil or empty Keys accepts every
// request: authentication is off.
type Keys struct {
	digests [][sha256.Size]byte
}

// KeyFlag collects a repeated --api-key flag: fs.Var(&kf, "api-key", ...).
type KeyFlag []string

// String implements flag.Value without revealing the keys.
func (f *KeyFlag) String() string {
	if f == nil || len(*f) == 0 {
		return ""
	}
	return fmt.Sprintf("%d keys", len(*f))
}

// Set implements flag.Value; each use adds one key.
func (f *KeyFlag) Set(v string) error {
	*f = append(*f, v)
	return nil
}

// LoadKeys returns the keys given directly plus those in file (when not
// empty): one key per line, blank lines and lines starting with # ignored,
// surrounding spaces trimmed, duplicates kept once. A key holding spaces
// or control bytes cannot travel in a header and is refused, as is an
// empty --api-key value.
func LoadKeys(keys []string, file string) (*Keys, error) {
	k := &Keys{}
	seen := map[[sha256.Size]byte]bool{}
	add := func(key, where string) error {
		if key == "" {
			return fmt.Errorf("%w: empty key in %s", ErrBadKey, where)
		}
		for i := 0; i < len(key); i++ {
			if key[i] <= ' ' || key[i] == 0x7f {
				return fmt.Errorf("%w: key in %s holds a space or control byte", ErrBadKey, where)
			}
		}
		d := sha256.Sum256([]byte(key))
		if !seen[d] {
			seen[d] = true
			k.digests = append(k.digests, d)
		}
		return nil
	}
	for i, key := range keys {
		if err := add(strings.TrimSpace(key), fmt.Sprintf("--api-key #%d", i+1)); err != nil {
			return nil, err
		}
	}
	if file != "" {
		data, err := os.ReadFile(file)
		if err != nil {
			return nil, fmt.Errorf("%w: --api-keys-file: %w", ErrBadKey, err)
		}
		sc := bufio.NewScanner(bytes.NewReader(data))
		sc.Buffer(make([]byte, 0, 4096), 64<<10)
		for line := 1; sc.Scan(); line++ {
			s := strings.TrimSpace(sc.Text())
			if s == "" || strings.HasPrefix(s, "#") {
				continue
			}
			if err := add(s, fmt.Sprintf("%s line %d", file, line)); err != nil {
				return nil, err
			}
		}
		if err := sc.Err(); err != nil {
			return nil, fmt.Errorf("%w: --api-keys-file %s: %w", ErrBadKey, file, err)
		}
	}
	return k, nil
}

// Enabled reports whether any key is configured, that is whether the
// guards check anything.
func (k *Keys) Enabled() bool { return k != nil && len(k.digests) > 0 }

// Len returns the number of distinct keys.
func (k *Keys) Len() int {
	if k == nil {
		return 0
	}
	return len(k.digests)
}

// Valid reports whether key is one of the keys. Every configured key is
// compared, without an early exit, on digests of fixed length.
func (k *Keys) Valid(key string) bool {
	if !k.Enabled() || key == "" {
		return false
	}
	d := sha256.Sum256([]byte(key))
	match := 0
	for i := range k.digests {
		match |= subtle.ConstantTimeCompare(d[:], k.digests[i][:])
	}
	return match == 1
}

// bearer returns the credentials of an "Authorization: Bearer <key>"
// value; the scheme is case-insensitive (RFC 6750, RFC 9110 11.1).
func bearer(v string) (string, bool) {
	const scheme = "bearer "
	if len(v) < len(scheme) || !strings.EqualFold(v[:len(scheme)], scheme) {
		return "", false
	}
	key := strings.TrimSpace(v[len(scheme):])
	return key, key != ""
}
