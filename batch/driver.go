package batch

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Runner runs one batch line as its endpoint would answer it over HTTP:
// the same validation, answer assembly, error shape and status code. The
// ingress implements it in-process.
type Runner interface {
	RunLine(ctx context.Context, endpoint string, body []byte, requestID string) (status int, answer []byte)
}

// DriverConfig configures a Driver.
type DriverConfig struct {
	// ID names this broker in leases and /v1/fleet.
	ID string
	// Lease is how long a driver's lease on a batch lasts unrenewed; it
	// is renewed every third of it, and another broker takes the batch
	// over once it has lapsed (default 15s).
	Lease time.Duration
	// Poll is how often the driver looks for batches to drive and checks
	// its batches for a cancel (default 1s).
	Poll time.Duration
	// InFlight bounds the lines of one batch in flight at once (default 64).
	InFlight int
	// MaxBatches bounds the batches this broker drives at once (default 16).
	MaxBatches int
	// MaxLineBytes bounds one input line (default 4 MiB, the HTTP body
	// limit).
	MaxLineBytes int
	// RetryMax is the longest wait before trying again a line the fleet
	// had no room for (default 30s); waits start at a second and double.
	RetryMax time.Duration
}

func (c *DriverConfig) defaults() {
	if c.Lease <= 0 {
		c.Lease = 15 * time.Second
	}
	if c.Poll <= 0 {
		c.Poll = time.Second
	}
	if c.InFlight <= 0 {
		c.InFlight = 64
	}
	if c.MaxBatches <= 0 {
		c.MaxBatches = 16
	}
	if c.MaxLineBytes <= 0 {
		c.MaxLineBytes = 4 << 20
	}
	if c.RetryMax <= 0 {
		c.RetryMax = 30 * time.Second
	}
}

// Driver runs batches: it takes the lease of any batch in flight that no
// live broker drives, and drives it to its end.
type Driver struct {
	st      *Store
	run     Runner
	models  func() []string
	cfg     DriverConfig
	log     *slog.Logger
	metrics *Metrics

	mu      sync.Mutex // guards driving
	driving map[string]bool
}

// NewDriver returns a driver of st's batches that runs lines with run and
// checks models against models().
func NewDriver(st *Store, run Runner, models func() []string, cfg DriverConfig, log *slog.Logger, m *Metrics) *Driver {
	cfg.defaults()
	if log == nil {
		log = slog.Default()
	}
	if m == nil {
		m = NewMetrics()
	}
	return &Driver{st: st, run: run, models: models, cfg: cfg, log: log, metrics: m, driving: map[string]bool{}}
}

// Run drives batches until ctx ends; the batches it drives are left to
// other brokers (their leases lapse, or are released here).
func (d *Driver) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	defer wg.Wait()
	t := time.NewTicker(d.cfg.Poll)
	defer t.Stop()
	for {
		d.scan(ctx, &wg)
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// scan takes the lease of each batch in flight that nobody holds.
func (d *Driver) scan(ctx context.Context, wg *sync.WaitGroup) {
	rs, err := d.st.active(ctx)
	if err != nil {
		if ctx.Err() == nil {
			d.log.Debug("batch driver: listing batches", "err", err)
		}
		return
	}
	for _, r := range rs {
		if terminal(r.Status) {
			continue
		}
		d.mu.Lock()
		busy, n := d.driving[r.ID], len(d.driving)
		d.mu.Unlock()
		if busy || n >= d.cfg.MaxBatches {
			continue
		}
		rev, ok := d.acquire(ctx, r.ID)
		if !ok {
			continue
		}
		d.mu.Lock()
		d.driving[r.ID] = true
		d.mu.Unlock()
		wg.Add(1)
		go func() {
			defer wg.Done()
			d.drive(ctx, r.ID, rev)
			d.mu.Lock()
			delete(d.driving, r.ID)
			d.mu.Unlock()
		}()
	}
}

type lease struct {
	Holder string `json:"holder"`
	Until  int64  `json:"until_ms"`
}

func (d *Driver) leaseValue() []byte {
	v, _ := json.Marshal(lease{Holder: d.cfg.ID, Until: time.Now().Add(d.cfg.Lease).UnixMilli()})
	return v
}

// acquire takes batch id's lease when it is free or has lapsed; the
// revision written is the lease's, which each renewal must match.
func (d *Driver) acquire(ctx context.Context, id string) (uint64, bool) {
	_, kv, err := d.st.buckets(ctx)
	if err != nil {
		return 0, false
	}
	e, err := kv.Get(ctx, leaseKey(id))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		rev, err := kv.Create(ctx, leaseKey(id), d.leaseValue())
		return rev, err == nil
	}
	if err != nil {
		return 0, false
	}
	var l lease
	if json.Unmarshal(e.Value(), &l) == nil && time.Now().UnixMilli() < l.Until {
		return 0, false
	}
	rev, err := kv.Update(ctx, leaseKey(id), d.leaseValue(), e.Revision())
	if err == nil {
		d.log.Info("batch driver: took over", "batch", id, "from", l.Holder)
	}
	return rev, err == nil
}

// drive moves batch id on to its end while this broker holds its lease.
func (d *Driver) drive(ctx context.Context, id string, rev uint64) {
	d.metrics.driven.Inc()
	defer d.metrics.driven.Dec()
	lctx, lost := context.WithCancel(ctx)
	defer lost()
	_, kv, _ := d.st.buckets(ctx)
	var renew sync.WaitGroup
	renew.Add(1)
	var held uint64 // the lease's revision, once renewals stop
	go func() {
		defer renew.Done()
		t := time.NewTicker(d.cfg.Lease / 3)
		defer t.Stop()
		for {
			select {
			case <-lctx.Done():
				held = rev
				return
			case <-t.C:
			}
			r, err := kv.Update(lctx, leaseKey(id), d.leaseValue(), rev)
			if err != nil {
				if lctx.Err() != nil {
					held = rev
					return
				}
				if errors.Is(err, jetstream.ErrKeyExists) {
					d.log.Warn("batch driver: lease lost", "batch", id)
					lost()
					return
				}
				continue // NATS away: try again while the lease lasts
			}
			rev = r
		}
	}()
	defer func() {
		lost()
		renew.Wait()
		if held != 0 {
			dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
			_ = kv.Delete(dctx, leaseKey(id), jetstream.LastRevision(held))
			cancel()
		}
	}()
	d.log.Info("batch driver: driving", "batch", id)
	for lctx.Err() == nil {
		r, _, err := d.st.record(lctx, id)
		if err != nil {
			if errors.Is(err, ErrNotFound) {
				return
			}
			if !sleep(lctx, d.cfg.Poll) {
				return
			}
			continue
		}
		var next error
		switch r.Status {
		case StatusValidating:
			next = d.validate(lctx, r)
		case StatusInProgress:
			next = d.runLines(lctx, r)
		case StatusFinalizing:
			next = d.finalize(lctx, r, r.End)
		case StatusCancelling:
			next = d.finalize(lctx, r, StatusCancelled)
		default:
			return
		}
		if next != nil && lctx.Err() == nil {
			d.log.Warn("batch driver", "batch", id, "status", r.Status, "err", next)
			if !sleep(lctx, d.cfg.Poll) {
				return
			}
		}
	}
}

func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// validate reads the batch's input and moves it to in_progress, or to
// failed with the errors found.
func (d *Driver) validate(ctx context.Context, r *record) error {
	now := time.Now()
	if now.Unix() >= *r.ExpiresAt {
		return d.setEnd(ctx, r.ID, StatusExpired)
	}
	_, rd, err := d.st.OpenFile(ctx, r.Owner, r.InputFileID)
	var n int
	var errs []ErrorEntry
	switch {
	case errors.Is(err, ErrNotFound):
		errs = []ErrorEntry{{Code: "invalid_file", Message: fmt.Sprintf("The input file %s no longer exists.", r.InputFileID), Param: ptr("input_file_id")}}
	case err != nil:
		return err
	default:
		n, errs, err = validate(ctx, rd, r.Endpoint, d.cfg.MaxLineBytes, d.st.cfg.MaxLines, d.models())
		rd.Close()
		if err != nil {
			return err
		}
	}
	_, err = d.st.update(ctx, r.ID, func(r *record) bool {
		if r.Status != StatusValidating {
			return r.Status == StatusCancelling && len(errs) == 0 && setTotal(r, n)
		}
		t := time.Now().Unix()
		if len(errs) > 0 {
			r.Status, r.FailedAt = StatusFailed, ptr(t)
			r.Errors = &Errors{Object: "list", Data: errs}
			return true
		}
		r.Status, r.InProgressAt = StatusInProgress, ptr(t)
		r.RequestCounts.Total = n
		return true
	})
	return err
}

func setTotal(r *record, n int) bool {
	r.RequestCounts.Total = n
	return true
}

// setEnd moves a batch whose window closed before it ran to finalizing.
func (d *Driver) setEnd(ctx context.Context, id, end string) error {
	_, err := d.st.update(ctx, id, func(r *record) bool {
		if terminal(r.Status) || r.Status == StatusCancelling || r.Status == StatusFinalizing {
			return false
		}
		r.Status, r.End, r.FinalizingAt = StatusFinalizing, end, ptr(time.Now().Unix())
		return true
	})
	return err
}

// lineID is the id of line idx's request and output line, the same on
// every broker, so an output assembled again is the same file.
func lineID(batchID string, idx int) string {
	h := sha256.Sum256([]byte(batchID + "/" + strconv.Itoa(idx)))
	return "batch_req_" + hex.EncodeToString(h[:12])
}

// results reads the lines already recorded: which are done, and how many
// of them succeeded.
func (d *Driver) results(ctx context.Context, id string, total int) ([]bool, RequestCounts, error) {
	_, kv, err := d.st.buckets(ctx)
	if err != nil {
		return nil, RequestCounts{}, err
	}
	done := make([]bool, total)
	c := RequestCounts{Total: total}
	lister, err := kv.ListKeysFiltered(ctx, resultsFilter(id))
	if err != nil {
		return nil, c, err
	}
	var idxs []int
	for k := range lister.Keys() {
		i, err := strconv.Atoi(k[len(resultsFilter(id))-1:])
		if err == nil && i >= 0 && i < total {
			idxs = append(idxs, i)
		}
	}
	for _, i := range idxs {
		res, err := d.result(ctx, id, i)
		if err != nil {
			return nil, c, err
		}
		if res == nil || done[i] {
			continue
		}
		done[i] = true
		if res.ok() {
			c.Completed++
		} else {
			c.Failed++
		}
	}
	return done, c, nil
}

func (d *Driver) result(ctx context.Context, id string, idx int) (*result, error) {
	_, kv, err := d.st.buckets(ctx)
	if err != nil {
		return nil, err
	}
	e, err := kv.Get(ctx, resultKey(id, idx))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	res := &result{}
	if err := json.Unmarshal(e.Value(), res); err != nil {
		return nil, fmt.Errorf("result %d: %w", idx, err)
	}
	return res, nil
}

var errCancelled = errors.New("batch cancelled")

// runLines runs every line not done yet, at most InFlight at once, each
// until it has an answer to record, and then moves the batch on:
// finalizing when all are done or its window closed.
func (d *Driver) runLines(ctx context.Context, r *record) error {
	total := r.RequestCounts.Total
	done, counts, err := d.results(ctx, r.ID, total)
	if err != nil {
		return err
	}
	expires := time.Unix(*r.ExpiresAt, 0)
	ectx, cancelE := context.WithDeadline(ctx, expires)
	defer cancelE()
	cctx, cancel := context.WithCancelCause(ectx)
	defer cancel(nil)

	var mu sync.Mutex // guards counts and running
	running := 0
	var wg sync.WaitGroup
	// The watcher writes progress and notices a cancel.
	watchDone := make(chan struct{})
	go func() {
		defer close(watchDone)
		var last RequestCounts
		lastRun := -1
		for sleep(cctx, d.cfg.Poll) {
			mu.Lock()
			c, run := counts, running
			mu.Unlock()
			rec, err := d.st.update(cctx, r.ID, func(r *record) bool {
				if r.Status != StatusInProgress || (c == last && run == lastRun) {
					return false
				}
				r.RequestCounts, r.Running, r.Driver = c, run, d.cfg.ID
				return true
			})
			if err == nil {
				last, lastRun = c, run
				if rec.Status == StatusCancelling {
					cancel(errCancelled)
					return
				}
			}
		}
	}()

	_, rd, err := d.st.OpenFile(cctx, r.Owner, r.InputFileID)
	if err != nil {
		cancel(nil)
		<-watchDone
		return err
	}
	sem := make(chan struct{}, d.cfg.InFlight)
	lr := newLineReader(rd, d.cfg.MaxLineBytes)
	known := func(string) bool { return true } // checked when validated
	var readErr error
	for idx := 0; ; idx++ {
		b, _, err := lr.next()
		if err == io.EOF {
			break
		}
		if err != nil {
			readErr = err
			break
		}
		if idx >= total || done[idx] {
			continue
		}
		p, e := parseLine(b, r.Endpoint, known)
		if e != nil {
			readErr = fmt.Errorf("line %d changed since validation: %s", idx, e.Message)
			break
		}
		p.body = append([]byte(nil), p.body...)
		select {
		case sem <- struct{}{}:
		case <-cctx.Done():
		}
		if cctx.Err() != nil {
			break
		}
		mu.Lock()
		running++
		mu.Unlock()
		d.metrics.running.WithLabelValues(p.model).Inc()
		wg.Add(1)
		go func(idx int, p parsed) {
			defer wg.Done()
			defer func() { <-sem }()
			res := d.runLine(cctx, r, idx, p)
			d.metrics.running.WithLabelValues(p.model).Dec()
			mu.Lock()
			running--
			mu.Unlock()
			if res == nil {
				return
			}
			if err := d.record(cctx, r.ID, idx, res); err != nil {
				return
			}
			outcome := "completed"
			mu.Lock()
			if res.ok() {
				counts.Completed++
			} else {
				counts.Failed++
				outcome = "failed"
			}
			mu.Unlock()
			d.metrics.lines.WithLabelValues(p.model, outcome).Inc()
		}(idx, p)
	}
	rd.Close()
	wg.Wait()
	cause := context.Cause(cctx)
	cancel(nil)
	<-watchDone
	switch {
	case ctx.Err() != nil:
		return ctx.Err()
	case errors.Is(cause, errCancelled):
		return nil // the record says cancelling: drive finalizes it
	case readErr != nil:
		return readErr
	case !time.Now().Before(expires):
		return d.setEnd(ctx, r.ID, StatusExpired)
	}
	_, err = d.st.update(ctx, r.ID, func(rec *record) bool {
		if rec.Status != StatusInProgress {
			return false
		}
		rec.Status, rec.End, rec.FinalizingAt = StatusFinalizing, StatusCompleted, ptr(time.Now().Unix())
		rec.RequestCounts, rec.Running = counts, 0
		return true
	})
	if err == nil && counts.Completed+counts.Failed < total {
		// A line's record failed (NATS away): run what is missing again.
		_, err = d.st.update(ctx, r.ID, func(rec *record) bool {
			if rec.Status != StatusFinalizing {
				return false
			}
			rec.Status, rec.End = StatusInProgress, ""
			return true
		})
	}
	return err
}

// retryable reports whether an answer says the fleet had no room or no
// link now (429, 503): the line is tried again later, within the window.
func retryable(status int) bool {
	return status == 429 || status == 503
}

// runLine runs one line until it has an answer worth recording; nil when
// the batch stopped first (cancel, window, lease lost).
func (d *Driver) runLine(ctx context.Context, r *record, idx int, p parsed) *result {
	wait := time.Second
	rid := lineID(r.ID, idx)
	for {
		status, body := d.run.RunLine(ctx, r.Endpoint, p.body, rid)
		if ctx.Err() != nil {
			return nil
		}
		if !retryable(status) {
			res := &result{CustomID: p.customID, Status: status, RequestID: rid}
			if json.Valid(body) {
				res.Body = body
			} else {
				res.Body, _ = json.Marshal(string(body))
			}
			return res
		}
		d.metrics.retries.WithLabelValues(p.model).Inc()
		if !sleep(ctx, wait) {
			return nil
		}
		wait = min(2*wait, d.cfg.RetryMax)
	}
}

// record stores line idx's result unless one is there already: the first
// result recorded is the line's, whoever ran it.
func (d *Driver) record(ctx context.Context, id string, idx int, res *result) error {
	_, kv, err := d.st.buckets(ctx)
	if err != nil {
		return err
	}
	data, _ := json.Marshal(res)
	for {
		_, err := kv.Create(ctx, resultKey(id, idx), data)
		if err == nil {
			return nil
		}
		if errors.Is(err, jetstream.ErrKeyExists) {
			return errors.New("recorded already")
		}
		if errors.Is(err, nats.ErrMaxPayload) && res.Error == nil {
			// An answer larger than a NATS message is the line's error.
			*res = result{CustomID: res.CustomID, Error: &LineError{Code: "response_too_large",
				Message: fmt.Sprintf("The answer (%d bytes) is larger than the broker's NATS connection carries in one message.", len(res.Body))}}
			data, _ = json.Marshal(res)
			continue
		}
		if !sleep(ctx, time.Second) {
			return ctx.Err()
		}
	}
}

// finalize writes the output and error files, each line in input order,
// and ends the batch in status end. A line without a result was cut off
// by the window or a cancel and gets OpenAI's error line for it.
func (d *Driver) finalize(ctx context.Context, r *record, end string) error {
	if end == "" {
		end = StatusCompleted
	}
	total := r.RequestCounts.Total
	if r.InProgressAt == nil && end != StatusCompleted {
		// Cut off before validation finished: no lines to report.
		total = 0
	}
	missing := LineError{Code: "batch_expired", Message: "This request could not be executed before the completion window expired."}
	if end == StatusCancelled {
		missing = LineError{Code: "batch_cancelled", Message: "This request was not executed because the batch was cancelled."}
	}
	var counts RequestCounts
	counts.Total = total
	write := func(okPass bool, name string) (*string, error) {
		pr, pw := io.Pipe()
		n := 0
		go func() {
			// The input is read beside the results, for the custom_id of
			// lines without one.
			_, in, err := d.st.OpenFile(ctx, r.Owner, r.InputFileID)
			if err != nil {
				pw.CloseWithError(err)
				return
			}
			defer in.Close()
			lr := newLineReader(in, d.cfg.MaxLineBytes)
			enc := json.NewEncoder(pw)
			enc.SetEscapeHTML(false)
			for i := 0; i < total; i++ {
				b, _, err := lr.next()
				if err != nil {
					pw.CloseWithError(fmt.Errorf("input line %d: %w", i, err))
					return
				}
				res, err := d.result(ctx, r.ID, i)
				if err != nil {
					pw.CloseWithError(err)
					return
				}
				line := outputLine{ID: lineID(r.ID, i)}
				ok := false
				if res != nil {
					line.CustomID = res.CustomID
					ok = res.ok()
					if res.Error != nil {
						line.Error = res.Error
					} else {
						line.Response = &response{StatusCode: res.Status, RequestID: res.RequestID, Body: res.Body}
					}
				} else {
					var il inputLine
					if err := json.Unmarshal(b, &il); err != nil || il.CustomID == nil {
						pw.CloseWithError(fmt.Errorf("input line %d: no custom_id", i))
						return
					}
					line.CustomID, line.Error = *il.CustomID, &missing
				}
				if ok != okPass {
					continue
				}
				n++
				if err := enc.Encode(line); err != nil {
					return
				}
			}
			pw.Close()
		}()
		id := "file-" + r.ID + "-" + name
		_, err := d.st.putFile(ctx, id, r.Owner, r.ID+"_"+name+".jsonl", "batch_output", pr)
		pr.Close()
		if err != nil {
			return nil, err
		}
		if okPass {
			counts.Completed = n
		} else {
			counts.Failed = n
		}
		if n == 0 {
			obj, _, _ := d.st.buckets(ctx)
			_ = obj.Delete(ctx, id)
			return nil, nil
		}
		return &id, nil
	}
	out, err := write(true, "output")
	if err != nil {
		return err
	}
	errf, err := write(false, "errors")
	if err != nil {
		return err
	}
	_, err = d.st.update(ctx, r.ID, func(rec *record) bool {
		if terminal(rec.Status) {
			return false
		}
		t := ptr(time.Now().Unix())
		rec.Status, rec.OutputFileID, rec.ErrorFileID, rec.RequestCounts, rec.Running = end, out, errf, counts, 0
		switch end {
		case StatusCompleted:
			rec.CompletedAt = t
		case StatusExpired:
			rec.ExpiredAt = t
		case StatusCancelled:
			rec.CancelledAt = t
		}
		return true
	})
	if err != nil {
		return err
	}
	d.purgeResults(ctx, r.ID)
	d.log.Info("batch driver: batch ended", "batch", r.ID, "status", end, "completed", counts.Completed, "failed", counts.Failed)
	return nil
}

// purgeResults drops a finished batch's line results, now in its files.
func (d *Driver) purgeResults(ctx context.Context, id string) {
	st, err := d.st.js.Stream(ctx, "KV_"+StateBucket)
	if err != nil {
		return
	}
	_ = st.Purge(ctx, jetstream.WithPurgeSubject("$KV."+StateBucket+"."+resultsFilter(id)))
}
