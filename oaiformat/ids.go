package oaiformat

import (
	"strings"

	"github.com/switchyard-ai/switchyard/wire"
)

// RequestID is the id every engine request of job carries (HTTP header
// X-Request-Id, gRPC metadata x-request-id), the same on both PD legs and
// on every attempt, as vLLM's proxy sends one id to both legs: the
// client's id (the ingress echoes it, or the one it made up, back to the
// client) so that engine logs and the client's id meet, else the broker's.
//
// A client id that spells an address the way vLLM's P2P NCCL connector
// reads one from request ids ("___prefill_addr_host:port___") is a
// hand-off instruction, not an id: it is replaced by the broker's.
func RequestID(job *wire.Job) string {
	id := job.GetClientRequestId()
	if id == "" || strings.Contains(id, "_addr_") {
		return job.GetRequestId()
	}
	return id
}

// TraceHeaders are the W3C trace context members of Job.trace, which
// engines receive as headers (gRPC metadata) of the same names.
var TraceHeaders = []string{"traceparent", "tracestate"}
