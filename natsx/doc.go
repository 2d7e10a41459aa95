// Package natsx holds what the broker and the agents both need from NATS
// beyond nats.go itself, so that each is written once: the classification
// of JetStream errors (a failure that passes by itself, to be tried again,
// and a full queue, which is an answer), a JetStream publish that rides
// out a leader election and a reconnect, and a wait for the connection.
//
// It is a leaf: it imports nats.go and the standard library only, and the
// product packages import it.
package natsx
