// Package testwait holds the helpers the tests share to wait for a state:
// For polls for a state to hold, as nats-server's checkFor does, instead
// of sleeping for it or waiting for an earlier sign of it (a log line, a
// first message); Buffer is a log a test reads while others write it.
package testwait
