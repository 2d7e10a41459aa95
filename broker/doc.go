// Package broker is the NATS side of the Switchyard broker: it keeps the
// capacity table built from agent heartbeats, asks package dispatch for the
// route of each request, publishes the job to the JetStream work queue,
// demultiplexes the chunks that agents send back on the broker's reply
// subjects, and publishes cancels. It knows nothing of HTTP or gRPC; the
// ingress packages turn a Call into SSE or gRPC stream messages.
//
// The locks a request takes, their order and the hand-off of chunks from
// the reply goroutine to a call's reader are written down in
// locksordering.txt beside this file.
package broker
