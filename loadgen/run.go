package loadgen

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Option sets a rarely needed knob of [Run].
type Option func(*options)

type options struct {
	client   *http.Client
	progress io.Writer
	every    time.Duration
	raw      io.Writer
	roots    *x509.CertPool
}

// WithHTTPClient replaces the tuned client Run builds (for a custom TLS
// config or an in-process transport).
func WithHTTPClient(c *http.Client) Option { return func(o *options) { o.client = c } }

// WithProgress draws a one-line progress bar on w (a terminal) every
// interval while the run lasts.
func WithProgress(w io.Writer, interval time.Duration) Option {
	return func(o *options) { o.progress, o.every = w, interval }
}

// WithRootCAs makes the client Run builds trust the certificate
// authorities in pool (a broker serving TLS with a private CA) instead of
// the system's. It has no effect with WithHTTPClient.
func WithRootCAs(pool *x509.CertPool) Option { return func(o *options) { o.roots = pool } }

// WithRawOut writes one JSON line per request to w once the run is done,
// warm-up included and marked, in issue order; see [RawRecord].
func WithRawOut(w io.Writer) Option { return func(o *options) { o.raw = w } }

// Run drives the load cfg describes and returns its report once every
// issued request has finished. If ctx ends first, Run cancels the requests
// in flight, leaves them out and returns the report of those that finished
// together with an error wrapping ctx's.
func Run(ctx context.Context, cfg Config, opts ...Option) (*Report, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.API == "" {
		cfg.API = APIChat
	}
	o := options{every: 250 * time.Millisecond}
	for _, opt := range opts {
		opt(&o)
	}
	if o.client == nil {
		conns := cfg.Concurrency
		if cfg.Rate > 0 && conns == 0 {
			conns = 1024
		}
		tr := newTransport(max(conns, 16))
		if o.roots != nil {
			tr.TLSClientConfig = &tls.Config{RootCAs: o.roots, MinVersion: tls.VersionTLS12}
		}
		defer tr.CloseIdleConnections()
		o.client = &http.Client{Transport: tr}
	}
	r := &runner{
		cfg:   cfg,
		sched: schedule{cfg: &cfg},
		client: client{
			http:    o.client,
			url:     strings.TrimSuffix(cfg.URL, "/") + cfg.API.path(),
			apiKey:  cfg.APIKey,
			timeout: cfg.Timeout,
		},
	}
	r.epoch = time.Now()
	r.sched.start = r.epoch

	var stopProgress func()
	if o.progress != nil {
		stopProgress = r.progress(o.progress, o.every)
	}
	if cfg.Rate > 0 {
		r.poisson(ctx)
	} else {
		r.closedLoop(ctx)
	}
	if stopProgress != nil {
		stopProgress()
	}
	rep := r.report()
	if o.raw != nil {
		if err := writeRaw(o.raw, r.records); err != nil {
			return rep, fmt.Errorf("loadgen: raw output: %w", err)
		}
	}
	if err := ctx.Err(); err != nil {
		return rep, fmt.Errorf("loadgen: run interrupted: %w", err)
	}
	return rep, nil
}

type runner struct {
	cfg    Config
	client client
	sched  schedule
	epoch  time.Time

	done, failed atomic.Int64 // measured requests, for the progress bar

	mu      sync.Mutex
	records []*record
}

// one sends request i and keeps its record.
func (r *runner) one(ctx context.Context, i int, warm bool) {
	rec := &record{index: i, warmup: warm}
	r.client.do(ctx, r.cfg.body(r.cfg.spec(i)), rec, r.epoch)
	rec.end = time.Since(r.epoch)
	if rec.start == 0 {
		rec.start = rec.end // failed before sending
	}
	if rec.kind == kindCanceled {
		return
	}
	if !warm {
		r.done.Add(1)
		if rec.kind != "" {
			r.failed.Add(1)
		}
	}
	r.mu.Lock()
	r.records = append(r.records, rec)
	r.mu.Unlock()
}

// closedLoop runs Concurrency workers, each sending its next request as
// soon as the previous one ends.
func (r *runner) closedLoop(ctx context.Context) {
	var wg sync.WaitGroup
	for range r.cfg.Concurrency {
		wg.Go(func() {
			for ctx.Err() == nil {
				i, warm, ok := r.sched.claim(time.Now())
				if !ok {
					return
				}
				r.one(ctx, i, warm)
			}
		})
	}
	wg.Wait()
}

// poisson issues requests at exponential intervals on an absolute
// timeline, so a late wake-up is made up by the next arrivals rather than
// lowering the rate. With a Concurrency cap an arrival waits for a free
// slot and its clock starts when it is sent.
func (r *runner) poisson(ctx context.Context) {
	var sem chan struct{}
	if r.cfg.Concurrency > 0 {
		sem = make(chan struct{}, r.cfg.Concurrency)
	}
	rng := rand.New(rand.NewPCG(r.cfg.Seed, math.MaxUint64))
	timer := time.NewTimer(0)
	defer timer.Stop()
	<-timer.C
	var wg sync.WaitGroup
	at := r.epoch
	for ctx.Err() == nil {
		i, warm, ok := r.sched.claim(at)
		if !ok {
			break
		}
		wg.Go(func() {
			if sem != nil {
				select {
				case sem <- struct{}{}:
					defer func() { <-sem }()
				case <-ctx.Done():
					return
				}
			}
			r.one(ctx, i, warm)
		})
		if !math.IsInf(r.cfg.Rate, 1) {
			at = at.Add(time.Duration(rng.ExpFloat64() / r.cfg.Rate * float64(time.Second)))
		}
		if d := time.Until(at); d > 0 {
			timer.Reset(d)
			select {
			case <-timer.C:
			case <-ctx.Done():
			}
		}
	}
	wg.Wait()
}

// schedule hands out request indices and decides warm-up and the end.
type schedule struct {
	cfg   *Config
	start time.Time

	mu       sync.Mutex
	issued   int
	measured int
	first    time.Time // first measured request; zero before
}

func (s *schedule) claim(now time.Time) (i int, warm, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := s.cfg
	warm = s.issued < c.WarmupRequests || now.Sub(s.start) < c.WarmupDuration
	if !warm {
		if s.first.IsZero() {
			s.first = now
		}
		if (c.Requests > 0 && s.measured >= c.Requests) || (c.Duration > 0 && now.Sub(s.first) >= c.Duration) {
			return 0, false, false
		}
		s.measured++
	}
	i = s.issued
	s.issued++
	return i, warm, true
}

// progress redraws a bar on w until the returned func is called.
func (r *runner) progress(w io.Writer, every time.Duration) (stop func()) {
	quit := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-t.C:
				r.drawProgress(w, false)
			case <-quit:
				r.drawProgress(w, true)
				return
			}
		}
	})
	return func() { close(quit); wg.Wait() }
}

func (r *runner) drawProgress(w io.Writer, final bool) {
	const width = 30
	elapsed := time.Since(r.epoch)
	done, failed := r.done.Load(), r.failed.Load()
	frac := 0.0
	if r.cfg.Requests > 0 {
		frac = float64(done) / float64(r.cfg.Requests)
	}
	if r.cfg.Duration > 0 {
		warm := r.cfg.WarmupDuration
		frac = max(frac, float64(elapsed-warm)/float64(r.cfg.Duration))
	}
	frac = min(max(frac, 0), 1)
	filled := int(frac * width)
	bar := strings.Repeat("=", filled) + strings.Repeat(" ", width-filled)
	end := ""
	if final {
		end = "\n"
	}
	fmt.Fprintf(w, "\r[%s] %3.0f%% %d done, %d errors, %.1f req/s, %s%s",
		bar, frac*100, done, failed, float64(done)/elapsed.Seconds(), elapsed.Round(time.Second), end)
}
