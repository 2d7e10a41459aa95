// Package batch is OpenAI's Files and Batches APIs on JetStream: files in an
// Object Store bucket, batches, their leases and their lines' results in a
// KV bucket, and the driver that runs a batch's lines through the broker as
// batch-class requests. Any broker drives any batch; a lease in the KV
// bucket makes one broker drive it at a time, and results keyed by line
// index make the output hold every custom_id exactly once whoever ran it.
package batch
