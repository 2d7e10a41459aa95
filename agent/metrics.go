package agent

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/switchyard-ai/switchyard/wire"
)

// Metrics are the agent's Prometheus collectors.
type Metrics struct {
	jobs     *prometheus.CounterVec
	ttft     prometheus.Histogram
	duration prometheus.Histogram
	active   prometheus.GaugeFunc
	hbErrors prometheus.Counter
	// publishRetries counts decode-job publishes tried again after a
	// passing failure.
	publishRetries prometheus.Counter
	// replyMsgs and replyChunks count the framed reply messages the
	// agent published and the chunks in them: their ratio is how well the
	// outbox gathers.
	replyMsgs, replyChunks prometheus.Counter
	// kvBlocks counts the engine blocks of KV events by translation
	// outcome, kvTokenize the prompts tokenized for it (kvforward.go).
	kvBlocks, kvTokenize *prometheus.CounterVec
	a                    *Agent
}

// Job outcomes.
const (
	JobOK        = "ok"
	JobError     = "error"
	JobCancelled = "cancelled"
	JobExpired   = "expired"
	JobHandedOff = "handed_off"
	JobDrained   = "drained" // ended by the drain timeout, continued elsewhere
	// JobPreempted: a batch job stopped for interactive work, run again
	// by the broker.
	JobPreempted = "preempted"
	// JobClientError: the engine refused the request as invalid (a 400):
	// the client's mistake, kept out of the error count operators watch.
	JobClientError = "client_error"
)

// errorOutcome is the outcome of a job that ended with err: client_error
// when the engine judged the request itself bad, else error.
func errorOutcome(err error) string {
	var we *wire.Error
	if errors.As(err, &we) && we.Code == wire.CodeBadRequest {
		return JobClientError
	}
	return JobError
}

func newMetrics(a *Agent) *Metrics {
	return &Metrics{
		a: a,
		jobs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "switchyard_agent_jobs_total", Help: "Jobs this agent ended, by outcome: ok, error (the engine or the agent failed), client_error (the engine refused the request as invalid), cancelled, expired, handed_off, drained.",
		}, []string{"outcome"}),
		ttft: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "switchyard_agent_engine_time_to_first_token_seconds", Help: "Time from calling the engine to its first token.",
			Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
		}),
		duration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "switchyard_agent_engine_request_duration_seconds", Help: "Time from calling the engine to the end of its answer.",
			Buckets: []float64{.05, .1, .25, .5, 1, 2.5, 5, 10, 20, 40, 80, 160, 320},
		}),
		active: prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "switchyard_agent_active_jobs", Help: "Jobs the agent holds now.",
		}, func() float64 { return float64(a.Active()) }),
		hbErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "switchyard_agent_heartbeat_publish_errors_total", Help: "Heartbeats that could not be published.",
		}),
		publishRetries: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "switchyard_agent_decode_publish_retries_total", Help: "Decode-job publishes tried again after a passing failure (no responders, timeout, reconnecting).",
		}),
		replyMsgs: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "switchyard_agent_reply_messages_total", Help: "Framed reply messages published to brokers (each holds one or more chunks).",
		}),
		kvBlocks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "switchyard_agent_kv_blocks_total", Help: "Engine blocks of BlockStored events with --kv-events-hash vllm, by outcome: translated (to broker keys as it arrived), unmatched (no recent prompt had its tokens when it arrived), unknown_parent (not translated); late counts unmatched ones translated once their prompt was tokenized.",
		}, []string{"outcome"}),
		kvTokenize: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "switchyard_agent_kv_tokenize_total", Help: "Prompts tokenized with the engine for --kv-events-hash vllm, by outcome: ok, error, skipped (too many in flight), unaligned (no message content found in the engine's text).",
		}, []string{"outcome"}),
		replyChunks: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "switchyard_agent_reply_chunks_total", Help: "Chunks sent to brokers in framed reply messages.",
		}),
	}
}

// Register adds the agent's collectors to r.
func (m *Metrics) Register(r prometheus.Registerer) error {
	for _, c := range []prometheus.Collector{m.jobs, m.ttft, m.duration, m.active, m.hbErrors, m.publishRetries, m.replyMsgs, m.replyChunks, m.kvBlocks, m.kvTokenize} {
		if err := r.Register(c); err != nil {
			return err
		}
	}
	return nil
}

// Metrics returns the agent's collectors.
func (a *Agent) Metrics() *Metrics { return a.metrics }
