// Package cmdtest runs the real broker and worker-agent commands in a
// test's own process, as their mains do but with a context the test ends,
// and waits for the states tests rely on: a broker ready on random
// loopback ports, an agent eligible in its fleet view, an engine healthy.
//
// A package whose own tests use cmdtest while cmdtest imports it (as
// internal/agentcmd, which the broker command imports for its demo agents)
// writes those tests in an external test package (package agentcmd_test).
package cmdtest
