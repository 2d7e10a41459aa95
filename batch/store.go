package batch

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Bucket names.
const (
	FilesBucket = "SWITCHYARD_FILES"
	StateBucket = "SWITCHYARD_BATCHES"
)

// Defaults of Config.
const (
	DefaultMaxFileBytes = 200 << 20
	DefaultMaxLines     = 50_000
	// Window is the one completion window OpenAI accepts.
	Window = 24 * time.Hour
)

// Endpoints a batch may run.
var Endpoints = []string{"/v1/chat/completions", "/v1/completions", "/v1/embeddings"}

// Config configures the store.
type Config struct {
	// Replicas and FileStorage of both buckets, as the jobs stream's.
	Replicas    int
	FileStorage bool
	// MaxFileBytes bounds an upload (DefaultMaxFileBytes when 0).
	MaxFileBytes int64
	// MaxLines bounds a batch's input lines (DefaultMaxLines when 0).
	MaxLines int
	// WindowCap, when set, shortens every batch's completion window to at
	// most this (an operator's bound; OpenAI's window is 24h).
	WindowCap time.Duration
}

// Store keeps files and batches in JetStream. Its buckets are created on
// first use, so a broker starts while NATS is away.
type Store struct {
	js  jetstream.JetStream
	cfg Config
	log *slog.Logger
	now func() time.Time

	mu  sync.Mutex // guards obj and kv; never held across a JetStream call
	obj jetstream.ObjectStore
	kv  jetstream.KeyValue
	// ended holds the ids of batches seen in a terminal status, which
	// never changes again: the driver's scan and /v1/fleet read only the
	// others' records.
	ended sync.Map
}

// NewStore returns the store on js.
func NewStore(js jetstream.JetStream, cfg Config, log *slog.Logger) *Store {
	if cfg.MaxFileBytes <= 0 {
		cfg.MaxFileBytes = DefaultMaxFileBytes
	}
	if cfg.MaxLines <= 0 {
		cfg.MaxLines = DefaultMaxLines
	}
	if cfg.Replicas <= 0 {
		cfg.Replicas = 1
	}
	if log == nil {
		log = slog.Default()
	}
	return &Store{js: js, cfg: cfg, log: log, now: time.Now}
}

// MaxFileBytes is the upload limit.
func (s *Store) MaxFileBytes() int64 { return s.cfg.MaxFileBytes }

func (s *Store) storage() jetstream.StorageType {
	if s.cfg.FileStorage {
		return jetstream.FileStorage
	}
	return jetstream.MemoryStorage
}

// buckets returns the buckets, creating them on first use. The lock is
// not held while JetStream answers, so a request (/v1/fleet among them)
// waits for NATS only as long as its own context allows, never behind
// another caller's slow creation; two callers creating at once is
// harmless, creation being idempotent.
func (s *Store) buckets(ctx context.Context) (jetstream.ObjectStore, jetstream.KeyValue, error) {
	s.mu.Lock()
	obj, kv := s.obj, s.kv
	s.mu.Unlock()
	if obj != nil && kv != nil {
		return obj, kv, nil
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if obj == nil {
		o, err := s.js.CreateOrUpdateObjectStore(ctx, jetstream.ObjectStoreConfig{
			Bucket:      FilesBucket,
			Description: "Switchyard files (Files API)",
			Storage:     s.storage(),
			Replicas:    s.cfg.Replicas,
		})
		if err != nil {
			return nil, nil, fmt.Errorf("%w: bucket %s: %w", ErrUnavailable, FilesBucket, err)
		}
		obj = o
	}
	if kv == nil {
		k, err := s.js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
			Bucket:      StateBucket,
			Description: "Switchyard batches, their leases and their lines' results",
			Storage:     s.storage(),
			Replicas:    s.cfg.Replicas,
			History:     1,
		})
		if err != nil {
			return nil, nil, fmt.Errorf("%w: bucket %s: %w", ErrUnavailable, StateBucket, err)
		}
		kv = k
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.obj == nil {
		s.obj = obj
	}
	if s.kv == nil {
		s.kv = kv
	}
	return s.obj, s.kv, nil
}

func newID(prefix string) string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}

// Purposes the store keeps; OpenAI's others (fine-tune, assistants,
// vision, user_data, evals) have no use here.
var purposes = []string{"batch", "batch_output"}

// limitReader fails with ErrTooLarge past n bytes.
type limitReader struct {
	r    io.Reader
	n    int64
	read int64
}

func (l *limitReader) Read(p []byte) (int, error) {
	n, err := l.r.Read(p)
	l.read += int64(n)
	if l.read > l.n {
		return n, ErrTooLarge
	}
	return n, err
}

// PutFile stores r as a new file of owner, streamed chunk by chunk into
// the Object Store; an upload larger than the limit is refused with
// ErrTooLarge and nothing of it kept.
func (s *Store) PutFile(ctx context.Context, owner, filename, purpose string, r io.Reader) (*File, error) {
	if purpose != "batch" {
		return nil, invalid("purpose", fmt.Sprintf("purpose %q is not stored here: only \"batch\" is", purpose))
	}
	return s.putFile(ctx, newID("file-"), owner, filename, purpose, &limitReader{r: r, n: s.cfg.MaxFileBytes})
}

func (s *Store) putFile(ctx context.Context, id, owner, filename, purpose string, r io.Reader) (*File, error) {
	created := s.now().Unix()
	info, err := s.putObject(ctx, jetstream.ObjectMeta{
		Name: id,
		Metadata: map[string]string{
			"owner": owner, "purpose": purpose, "filename": filename,
			"created_at": strconv.FormatInt(created, 10),
		},
	}, r)
	if err != nil {
		if errors.Is(err, ErrTooLarge) {
			return nil, fmt.Errorf("%w: larger than %d bytes", ErrTooLarge, s.cfg.MaxFileBytes)
		}
		if errors.Is(err, ErrUnavailable) {
			return nil, err
		}
		return nil, fmt.Errorf("%w: storing %s: %w", ErrUnavailable, id, err)
	}
	return fileOf(info), nil
}

func fileOf(info *jetstream.ObjectInfo) *File {
	created, _ := strconv.ParseInt(info.Metadata["created_at"], 10, 64)
	return &File{
		ID: info.Name, Object: "file", Bytes: int64(info.Size), CreatedAt: created,
		Filename: info.Metadata["filename"], Purpose: info.Metadata["purpose"], Status: "processed",
		owner: info.Metadata["owner"],
	}
}

// File returns owner's file id.
func (s *Store) File(ctx context.Context, owner, id string) (*File, error) {
	obj, _, err := s.buckets(ctx)
	if err != nil {
		return nil, err
	}
	info, err := obj.GetInfo(ctx, id)
	if err != nil {
		if errors.Is(err, jetstream.ErrObjectNotFound) || errors.Is(err, jetstream.ErrInvalidStoreName) || errors.Is(err, jetstream.ErrBadObjectMeta) {
			return nil, fmt.Errorf("%w: file %s", ErrNotFound, id)
		}
		if errors.Is(err, jetstream.ErrInvalidKey) || errors.Is(err, jetstream.ErrNameRequired) {
			return nil, fmt.Errorf("%w: file %s", ErrNotFound, id)
		}
		return nil, fmt.Errorf("%w: file %s: %w", ErrUnavailable, id, err)
	}
	f := fileOf(info)
	if f.owner != owner {
		return nil, fmt.Errorf("%w: file %s", ErrNotFound, id)
	}
	return f, nil
}

// ListFiles are the parameters of Files.
type ListFiles struct {
	Purpose string
	After   string
	Limit   int  // 1 to 10000; 0: 10000
	Asc     bool // order=asc
}

// Files lists owner's files by creation time (newest first unless Asc),
// starting after the file p.After; more reports whether others follow.
func (s *Store) Files(ctx context.Context, owner string, p ListFiles) (files []*File, more bool, err error) {
	obj, _, err := s.buckets(ctx)
	if err != nil {
		return nil, false, err
	}
	infos, err := obj.List(ctx)
	if err != nil && !errors.Is(err, jetstream.ErrNoObjectsFound) {
		return nil, false, fmt.Errorf("%w: listing files: %w", ErrUnavailable, err)
	}
	for _, info := range infos {
		f := fileOf(info)
		if f.owner != owner || (p.Purpose != "" && f.Purpose != p.Purpose) {
			continue
		}
		files = append(files, f)
	}
	slices.SortFunc(files, func(a, b *File) int {
		c := cmp.Or(cmp.Compare(a.CreatedAt, b.CreatedAt), cmp.Compare(a.ID, b.ID))
		if !p.Asc {
			c = -c
		}
		return c
	})
	if p.After != "" {
		i := slices.IndexFunc(files, func(f *File) bool { return f.ID == p.After })
		files = files[i+1:] // not found: i+1 == 0, the whole list
	}
	limit := p.Limit
	if limit <= 0 {
		limit = 10000
	}
	if len(files) > limit {
		return files[:limit], true, nil
	}
	return files, false, nil
}

// OpenFile returns owner's file id and a reader of its content, streamed
// from the Object Store a few chunks ahead; the caller closes it.
func (s *Store) OpenFile(ctx context.Context, owner, id string) (*File, io.ReadCloser, error) {
	obj, _, err := s.buckets(ctx)
	if err != nil {
		return nil, nil, err
	}
	if _, err := s.File(ctx, owner, id); err != nil {
		return nil, nil, err
	}
	info, err := obj.GetInfo(ctx, id)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: reading %s: %w", ErrUnavailable, id, err)
	}
	rd, err := s.openObject(ctx, info)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: reading %s: %w", ErrUnavailable, id, err)
	}
	return fileOf(info), rd, nil
}

// DeleteFile deletes owner's file id. The input of a batch in flight is
// refused: its driver reads it until the batch ends.
func (s *Store) DeleteFile(ctx context.Context, owner, id string) error {
	if _, err := s.File(ctx, owner, id); err != nil {
		return err
	}
	rs, err := s.active(ctx)
	if err != nil {
		return err
	}
	for _, r := range rs {
		if r.InputFileID == id {
			return invalid("id", fmt.Sprintf("file %s is the input of batch %s, which has not ended: cancel it first", id, r.ID))
		}
	}
	obj, _, _ := s.buckets(ctx)
	if err := obj.Delete(ctx, id); err != nil {
		if errors.Is(err, jetstream.ErrObjectNotFound) {
			return fmt.Errorf("%w: file %s", ErrNotFound, id)
		}
		return fmt.Errorf("%w: deleting %s: %w", ErrUnavailable, id, err)
	}
	return nil
}

// KV keys: b.<id> a batch's record, l.<id> its lease, r.<id>.<index> the
// result of its line index.
func batchKey(id string) string           { return "b." + id }
func leaseKey(id string) string           { return "l." + id }
func resultKey(id string, idx int) string { return "r." + id + "." + strconv.Itoa(idx) }
func resultsFilter(id string) string      { return "r." + id + ".*" }

// NewBatch are the parameters of CreateBatch.
type NewBatch struct {
	InputFileID      string
	Endpoint         string
	CompletionWindow string
	Metadata         map[string]string
}

// CreateBatch checks p and stores a new batch of owner in status
// validating; a driver validates its input.
func (s *Store) CreateBatch(ctx context.Context, owner string, p NewBatch) (*Batch, error) {
	switch {
	case p.InputFileID == "":
		return nil, invalid("input_file_id", "input_file_id is required")
	case !slices.Contains(Endpoints, p.Endpoint):
		return nil, invalid("endpoint", fmt.Sprintf("endpoint %q: want one of %v", p.Endpoint, Endpoints))
	case p.CompletionWindow != "24h":
		return nil, invalid("completion_window", fmt.Sprintf("completion_window %q: only \"24h\" is supported", p.CompletionWindow))
	case len(p.Metadata) > 16:
		return nil, invalid("metadata", "metadata holds at most 16 pairs")
	}
	for k, v := range p.Metadata {
		if len(k) > 64 || len(v) > 512 {
			return nil, invalid("metadata", "metadata keys hold at most 64 characters and values 512")
		}
	}
	f, err := s.File(ctx, owner, p.InputFileID)
	if errors.Is(err, ErrNotFound) {
		return nil, invalid("input_file_id", fmt.Sprintf("no file %q", p.InputFileID))
	}
	if err != nil {
		return nil, err
	}
	if f.Purpose != "batch" {
		return nil, invalid("input_file_id", fmt.Sprintf("file %q has purpose %q, not \"batch\"", f.ID, f.Purpose))
	}
	_, kv, err := s.buckets(ctx)
	if err != nil {
		return nil, err
	}
	now := s.now()
	window := Window
	if s.cfg.WindowCap > 0 && s.cfg.WindowCap < window {
		window = s.cfg.WindowCap
	}
	r := &record{Owner: owner, Batch: Batch{
		ID: newID("batch_"), Object: "batch", Endpoint: p.Endpoint, InputFileID: p.InputFileID,
		CompletionWindow: p.CompletionWindow, Status: StatusValidating, CreatedAt: now.Unix(),
		ExpiresAt: ptr(now.Add(window).Unix()), Metadata: p.Metadata,
	}}
	data, _ := json.Marshal(r)
	if _, err := kv.Create(ctx, batchKey(r.ID), data); err != nil {
		return nil, fmt.Errorf("%w: storing batch: %w", ErrUnavailable, err)
	}
	return r.public(), nil
}

func ptr[T any](v T) *T { return &v }

// record reads batch id with its revision.
func (s *Store) record(ctx context.Context, id string) (*record, uint64, error) {
	_, kv, err := s.buckets(ctx)
	if err != nil {
		return nil, 0, err
	}
	e, err := kv.Get(ctx, batchKey(id))
	if err != nil {
		if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrInvalidKey) {
			return nil, 0, fmt.Errorf("%w: batch %s", ErrNotFound, id)
		}
		return nil, 0, fmt.Errorf("%w: batch %s: %w", ErrUnavailable, id, err)
	}
	r := &record{}
	if err := json.Unmarshal(e.Value(), r); err != nil {
		return nil, 0, fmt.Errorf("batch %s: stored record: %w", id, err)
	}
	return r, e.Revision(), nil
}

// update applies f to batch id's record and stores it, again on a
// concurrent change; f returning false leaves the record as it is.
func (s *Store) update(ctx context.Context, id string, f func(r *record) bool) (*record, error) {
	_, kv, err := s.buckets(ctx)
	if err != nil {
		return nil, err
	}
	for {
		r, rev, err := s.record(ctx, id)
		if err != nil {
			return nil, err
		}
		if !f(r) {
			return r, nil
		}
		data, _ := json.Marshal(r)
		_, err = kv.Update(ctx, batchKey(id), data, rev)
		if err == nil {
			return r, nil
		}
		if !errors.Is(err, jetstream.ErrKeyExists) {
			return nil, fmt.Errorf("%w: batch %s: %w", ErrUnavailable, id, err)
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
	}
}

// Batch returns owner's batch id.
func (s *Store) Batch(ctx context.Context, owner, id string) (*Batch, error) {
	r, _, err := s.record(ctx, id)
	if err != nil {
		return nil, err
	}
	if r.Owner != owner {
		return nil, fmt.Errorf("%w: batch %s", ErrNotFound, id)
	}
	return r.public(), nil
}

// active returns the records of the batches not known to have ended.
func (s *Store) active(ctx context.Context) ([]*record, error) {
	return s.list(ctx, true)
}

// records returns every batch's record.
func (s *Store) records(ctx context.Context) ([]*record, error) {
	return s.list(ctx, false)
}

func (s *Store) list(ctx context.Context, activeOnly bool) ([]*record, error) {
	_, kv, err := s.buckets(ctx)
	if err != nil {
		return nil, err
	}
	lister, err := kv.ListKeysFiltered(ctx, "b.*")
	if err != nil {
		return nil, fmt.Errorf("%w: listing batches: %w", ErrUnavailable, err)
	}
	var ids []string
	for k := range lister.Keys() {
		ids = append(ids, k[len("b."):])
	}
	var out []*record
	for _, id := range ids {
		if _, ended := s.ended.Load(id); ended && activeOnly {
			continue
		}
		r, _, err := s.record(ctx, id)
		if errors.Is(err, ErrNotFound) {
			continue
		}
		if err != nil {
			return nil, err
		}
		if terminal(r.Status) {
			s.ended.Store(id, true)
			if activeOnly {
				continue
			}
		}
		out = append(out, r)
	}
	return out, nil
}

// Batches lists owner's batches, newest first, after the batch after;
// limit is 1 to 100 (0: 20).
func (s *Store) Batches(ctx context.Context, owner, after string, limit int) ([]*Batch, bool, error) {
	rs, err := s.records(ctx)
	if err != nil {
		return nil, false, err
	}
	var out []*Batch
	for _, r := range rs {
		if r.Owner == owner {
			out = append(out, r.public())
		}
	}
	slices.SortFunc(out, func(a, b *Batch) int { return -cmp.Or(cmp.Compare(a.CreatedAt, b.CreatedAt), cmp.Compare(a.ID, b.ID)) })
	if after != "" {
		i := slices.IndexFunc(out, func(b *Batch) bool { return b.ID == after })
		out = out[i+1:]
	}
	if limit <= 0 {
		limit = 20
	}
	if len(out) > limit {
		return out[:limit], true, nil
	}
	return out, false, nil
}

// CancelBatch asks owner's batch id to stop: a batch in flight moves to
// cancelling (its driver cancels its lines and writes what it has), a
// finished one is returned as it is.
func (s *Store) CancelBatch(ctx context.Context, owner, id string) (*Batch, error) {
	if _, err := s.Batch(ctx, owner, id); err != nil {
		return nil, err
	}
	r, err := s.update(ctx, id, func(r *record) bool {
		if terminal(r.Status) || r.Status == StatusCancelling {
			return false
		}
		r.Status = StatusCancelling
		r.CancellingAt = ptr(s.now().Unix())
		return true
	})
	if err != nil {
		return nil, err
	}
	return r.public(), nil
}

// Fleet is the batches section of /v1/fleet: every batch in flight
// counted, and the caller's own listed.
type Fleet struct {
	// Active counts the batches in flight (not yet ended), every owner's.
	Active int `json:"active"`
	// Lines adds up their lines.
	Lines FleetLines `json:"lines"`
	// Batches are the caller's batches in flight.
	Batches []FleetBatch `json:"items"`
}

// FleetLines counts a batch's lines: queued (neither run nor running),
// running (in flight, as of its driver's last update), completed (a 2xx
// answer) and failed (any other).
type FleetLines struct {
	Total     int `json:"total"`
	Queued    int `json:"queued"`
	Running   int `json:"running"`
	Completed int `json:"completed"`
	Failed    int `json:"failed"`
}

// FleetBatch is one batch in flight.
type FleetBatch struct {
	ID        string     `json:"id"`
	Status    string     `json:"status"`
	Endpoint  string     `json:"endpoint"`
	Driver    string     `json:"driver,omitempty"`
	Lines     FleetLines `json:"lines"`
	CreatedAt int64      `json:"created_at"`
	ExpiresAt int64      `json:"expires_at"`
}

// Fleet summarizes the batches in flight for owner.
func (s *Store) Fleet(ctx context.Context, owner string) (*Fleet, error) {
	rs, err := s.active(ctx)
	if err != nil {
		return nil, err
	}
	f := &Fleet{Batches: []FleetBatch{}}
	for _, r := range rs {
		if terminal(r.Status) {
			continue
		}
		c := r.RequestCounts
		l := FleetLines{Total: c.Total, Running: r.Running, Completed: c.Completed, Failed: c.Failed}
		l.Queued = max(0, c.Total-c.Completed-c.Failed-r.Running)
		f.Active++
		f.Lines.Total += l.Total
		f.Lines.Queued += l.Queued
		f.Lines.Running += l.Running
		f.Lines.Completed += l.Completed
		f.Lines.Failed += l.Failed
		if r.Owner == owner {
			f.Batches = append(f.Batches, FleetBatch{ID: r.ID, Status: r.Status, Endpoint: r.Endpoint, Driver: r.Driver, Lines: l, CreatedAt: r.CreatedAt, ExpiresAt: *r.ExpiresAt})
		}
	}
	slices.SortFunc(f.Batches, func(a, b FleetBatch) int { return cmp.Compare(a.CreatedAt, b.CreatedAt) })
	return f, nil
}
