// Package auth guards the broker's client ingress: API keys checked as
// OpenAI's Authorization: Bearer scheme on HTTP and as authorization
// metadata on gRPC, and the TLS configuration both servers share.
//
// Keys are compared as SHA-256 digests in constant time, so neither a key's
// bytes nor its length leak through timing. With no key configured every
// guard is a pass-through, which is the loopback development default.
package auth
