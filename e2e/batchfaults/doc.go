// Package batchfaults holds the Batches API's fault tests: real broker,
// worker-agent and nats-server processes, a batch in progress, and a
// SIGKILL of an agent or of one node of a 3-node JetStream cluster; every
// custom_id must then appear exactly once in the batch's output or error
// file. They run apart from package e2e, in parallel with each other,
// so that they add little to the suite's time.
package batchfaults
