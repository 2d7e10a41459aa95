package brokercmd

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/switchyard-ai/switchyard/batch"
	"github.com/switchyard-ai/switchyard/ingress/openaihttp"
)

// batchOptions are the Files and Batches APIs' flags.
type batchOptions struct {
	maxFileBytes int64
	windowCap    time.Duration
	inFlight     int
	lease        time.Duration
	maxLines     int
	maxBatches   int
}

var batchFlags = []string{"max-file-bytes", "batch-window-cap", "batch-inflight", "batch-lease", "batch-max-lines", "batch-max-driven"}

func registerBatchFlags(fs *flag.FlagSet, o *batchOptions) {
	fs.Int64Var(&o.maxFileBytes, "max-file-bytes", batch.DefaultMaxFileBytes, "largest file POST /v1/files stores, in bytes (413 above)")
	fs.DurationVar(&o.windowCap, "batch-window-cap", 0, "shorten every batch's completion window (24h) to at most this; 0: the full window")
	fs.IntVar(&o.inFlight, "batch-inflight", 64, "lines of one batch this broker keeps in flight at once")
	fs.DurationVar(&o.lease, "batch-lease", 15*time.Second, "a broker's lease on the batch it drives; renewed every third of it, and another broker takes the batch over once it lapses")
	fs.IntVar(&o.maxLines, "batch-max-lines", batch.DefaultMaxLines, "most lines (requests) in one batch's input file")
	fs.IntVar(&o.maxBatches, "batch-max-driven", 16, "most batches this broker drives at once")
}

func (o *batchOptions) validate() error {
	if o.maxFileBytes < 1 || o.inFlight < 1 || o.maxLines < 1 || o.maxBatches < 1 || o.lease < time.Second || o.windowCap < 0 {
		return fmt.Errorf("--max-file-bytes, --batch-inflight, --batch-max-lines and --batch-max-driven must be positive, --batch-lease at least 1s, --batch-window-cap not negative")
	}
	return nil
}

// newBatchStore returns the files and batches store on nc, its buckets
// stored and replicated as the jobs stream.
func newBatchStore(o *options, nc *nats.Conn, log *slog.Logger) (*batch.Store, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	return batch.NewStore(js, batch.Config{
		Replicas: o.replicas, FileStorage: o.jobsStorage == "file",
		MaxFileBytes: o.batch.maxFileBytes, MaxLines: o.batch.maxLines, WindowCap: o.batch.windowCap,
	}, log), nil
}

// runBatchDriver drives batches until ctx ends, running their lines
// through api.
func runBatchDriver(ctx context.Context, o *options, id string, st *batch.Store, api *openaihttp.Server, models func() []string, reg prometheus.Registerer, log *slog.Logger) error {
	m := batch.NewMetrics()
	if err := m.Register(reg); err != nil {
		return err
	}
	d := batch.NewDriver(st, api, models, batch.DriverConfig{
		ID: id, Lease: o.batch.lease, InFlight: o.batch.inFlight, MaxBatches: o.batch.maxBatches, MaxLineBytes: int(o.maxBody),
	}, log, m)
	return d.Run(ctx)
}
