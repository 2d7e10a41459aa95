// Package doccheck holds the tests that hold the README's examples to the
// code: its Go client compiles against this module as the README tells a
// user to depend on it, and its heartbeat sample has the fields agents
// publish. The NATS recipes of docs/operations.md are run by
// internal/natsauth, which owns the configuration they need.
package doccheck
