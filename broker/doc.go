// Package broker is the NATS side of the Switchyard broker: it keeps the
// capacity table built from agent heartbeats, asks package dispatch for the
// route of each request, publishes the job to the JetStream work queue,
// demultiplexes the chunks that agents send back on the broker's reply
// subjects, and publishes cancels. It knows nothing of HTTP or gRPC; the
// ingress packages turn a Call into SSE or gRPC stream messages.
//
// Lock order: Broker.mu (capacity table) and Broker.calls (in-flight map) are
// never held together; Call.mu is a leaf but for timings.mu (the learned
// latency), which the reply goroutine takes under it and rebuild under
// Broker.mu; timings.mu is taken last.
package broker
