package auth

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
)

type ownerKey struct{}

// Owner returns the owner of what a request stores (files, batches): a
// digest of its API key, or "" when keys are off. The key itself is never
// kept: the digest is salted apart from the key check's, and cut to 128
// bits.
func Owner(ctx context.Context) string {
	o, _ := ctx.Value(ownerKey{}).(string)
	return o
}

// ownerOf is key's owner digest.
func ownerOf(key string) string {
	d := sha256.Sum256([]byte("switchyard owner\x00" + key))
	return "k" + hex.EncodeToString(d[:16])
}

// WithOwner returns ctx carrying owner; the ingresses set it from the key.
func WithOwner(ctx context.Context, owner string) context.Context {
	return context.WithValue(ctx, ownerKey{}, owner)
}
