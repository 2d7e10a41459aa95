// Package testwait holds the one polling helper the tests share: wait for
// a state to hold, as nats-server's checkFor does, instead of sleeping for
// it or waiting for an earlier sign of it (a log line, a first message).
package testwait
