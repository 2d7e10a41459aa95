// Package auth guards the broker's client ingress: API keys checked as
// OpenAI's Authorization: Bearer scheme on HTTP and as authorization
// metadata on gRPC (as a stream's headers arrive, with a per-client bound
// on the streams that need no key), the connection limiter both listeners
// share, and the TLS configuration both servers share.
//
// Keys are compared as SHA-256 digests in constant time, so neither a key's
// bytes nor its length leak through timing. With no key configured every
// guard is a pass-through, which is the loopback development default.
package auth
