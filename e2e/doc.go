// Package e2e holds the end-to-end tests: the real broker and worker-agent
// commands run in-process against an embedded NATS server on random
// loopback ports, with sim-engines behind the agents, driven by the official
// OpenAI Go SDK and plain HTTP.
package e2e
