package simengine

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Side-channel paths of a prefill engine's bootstrap server.
const (
	// PathBootstrapHealth answers 200 while the side channel is up.
	PathBootstrapHealth = "/health"
	// PathVLLMKV + engine id: a vLLM decode pulls its KV with POST
	// {"block_ids":[...],"fingerprint":"..."}; 200 {"fingerprint":"..."}
	// or 404. A pull whose fingerprint matches consumes the blocks, which
	// frees them. PathVLLMKV + engine id + PathFree, with the same body
	// (no fingerprint needed), frees them unread: what a vLLM decode
	// engine tells its prefill when the decode request is aborted before
	// it read its KV; 200 {"freed":true|false}.
	PathVLLMKV = "/sim/vllm/kv/"
	// PathSGLangRoom + room: an SGLang decode long-polls with GET
	// ?fingerprint=...&wait=<duration>; 200 {"state":"pending"|"done"|
	// "failed",...} or 404 {"state":"unknown"} when the room has not
	// appeared within wait. A poll whose fingerprint matches a done room
	// consumes it, which frees its KV. POST PathSGLangRoom + room +
	// PathAbort is SGLang's decode-side abort: a pending room fails, a
	// done one is freed unread; 200 {"state":...}, the state it left the
	// room in ("unknown" when there was none).
	PathSGLangRoom = "/sim/sglang/rooms/"
	// PathFree and PathAbort end the paths above.
	PathFree  = "/free"
	PathAbort = "/abort"
)

const (
	// roomPollWait is the longest a decode's long poll waits per round.
	roomPollWait = time.Second
	maxPollWait  = 10 * time.Second
)

type roomState string

const (
	roomPending roomState = "pending"
	roomDone    roomState = "done"
	roomFailed  roomState = "failed"
	roomUnknown roomState = "unknown"
)

type room struct {
	fingerprint string
	state       roomState
	reason      string
	settled     chan struct{} // closed when state leaves pending
	// held is the KV of a done room, until a decode reads it; a failed
	// room holds none and is kept until its timer only so that a late
	// decode learns why.
	held  *hold
	timer *time.Timer // nil while pending
}

type kvEntry struct {
	fingerprint string
	held        *hold
}

// hold is the KV a prefill engine keeps for one hand-off, from the end of
// its prefill until a decode reads it, is aborted, or the hold times out.
type hold struct {
	blocks int
	timer  *time.Timer
}

// bootstrap is a prefill engine's side channel: the hand-offs it holds and
// the HTTP server decode engines reach them through.
type bootstrap struct {
	engineID string
	holdFor  time.Duration // Config.KVHoldTimeout
	port     int
	srv      *http.Server
	served   chan error

	mu        sync.Mutex
	closed    bool
	rooms     map[uint64]*room
	added     chan struct{} // closed and replaced when a room is registered
	kv        map[string]*kvEntry
	nextBlock int
	stats     kvStats
}

// kvStats is the hold accounting of [Engine.HeldKV] and /metrics.
type kvStats struct {
	handoffs, blocks int   // held now
	expired          int64 // freed unread at the hold timeout
	abandoned        int64 // freed unread because the decode was aborted
}

func startBootstrap(e *Engine) (*bootstrap, error) {
	addr := net.JoinHostPort(e.cfg.BootstrapHost, strconv.Itoa(e.cfg.BootstrapPort))
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("simengine: bootstrap listener: %w", err)
	}
	b := &bootstrap{
		engineID: e.engineID,
		holdFor:  e.cfg.KVHoldTimeout,
		port:     ln.Addr().(*net.TCPAddr).Port,
		served:   make(chan error, 1),
		rooms:    make(map[uint64]*room),
		added:    make(chan struct{}),
		kv:       make(map[string]*kvEntry),
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+PathBootstrapHealth, func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusOK)
	})
	mux.HandleFunc("POST "+PathVLLMKV+"{engine}", b.serveKV)
	mux.HandleFunc("POST "+PathVLLMKV+"{engine}"+PathFree, b.serveFree)
	mux.HandleFunc("GET "+PathSGLangRoom+"{room}", b.serveRoom)
	mux.HandleFunc("POST "+PathSGLangRoom+"{room}"+PathAbort, b.serveAbort)
	b.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() { b.served <- b.srv.Serve(ln) }()
	return b, nil
}

// close stops the server at once: cutting the long polls is what makes a
// waiting decode fail promptly. The KV held goes with the engine.
func (b *bootstrap) close() error {
	err := b.srv.Close()
	if serr := <-b.served; !errors.Is(serr, http.ErrServerClosed) && err == nil {
		err = serr
	}
	b.mu.Lock()
	b.closed = true
	for k, v := range b.kv {
		b.unhold(v.held)
		delete(b.kv, k)
	}
	for k, rm := range b.rooms {
		b.unhold(rm.held)
		if rm.timer != nil {
			rm.timer.Stop()
		}
		delete(b.rooms, k)
	}
	b.mu.Unlock()
	return err
}

// holdKV starts holding n blocks for one hand-off, calling expire (with
// b.mu held) if no decode has claimed them after b.holdFor; b.mu is held.
func (b *bootstrap) holdKV(n int, expire func()) *hold {
	h := &hold{blocks: n}
	h.timer = time.AfterFunc(b.holdFor, func() {
		b.mu.Lock()
		defer b.mu.Unlock()
		expire()
	})
	b.stats.handoffs++
	b.stats.blocks += n
	return h
}

// unhold frees a hold; b.mu is held. It reports whether h was held.
func (b *bootstrap) unhold(h *hold) bool {
	if h == nil || h.blocks == 0 {
		return false
	}
	h.timer.Stop()
	b.stats.handoffs--
	b.stats.blocks -= h.blocks
	h.blocks = 0
	return true
}

// put holds a vLLM prefill's KV, n blocks under fresh ids, with its
// fingerprint.
func (b *bootstrap) put(n int, fp string) []int {
	ids := make([]int, n)
	b.mu.Lock()
	defer b.mu.Unlock()
	for i := range ids {
		b.nextBlock++
		ids[i] = b.nextBlock
	}
	if b.closed {
		return ids // nobody can pull them
	}
	key := blockKey(b.engineID, ids)
	v := &kvEntry{fingerprint: fp}
	v.held = b.holdKV(n, func() {
		if b.kv[key] == v && b.unhold(v.held) {
			delete(b.kv, key)
			b.stats.expired++
		}
	})
	b.kv[key] = v
	return ids
}

// take looks the blocks up, consuming (freeing) them when fp matches.
func (b *bootstrap) take(engineID string, ids []int, fp string) (stored string, ok bool) {
	if engineID != b.engineID {
		return "", false
	}
	key := blockKey(engineID, ids)
	b.mu.Lock()
	defer b.mu.Unlock()
	v, ok := b.kv[key]
	if !ok {
		return "", false
	}
	if v.fingerprint == fp {
		b.unhold(v.held)
		delete(b.kv, key)
	}
	return v.fingerprint, true
}

// free drops blocks a decode will never read.
func (b *bootstrap) free(engineID string, ids []int) bool {
	if engineID != b.engineID {
		return false
	}
	key := blockKey(engineID, ids)
	b.mu.Lock()
	defer b.mu.Unlock()
	v, ok := b.kv[key]
	if !ok {
		return false
	}
	b.unhold(v.held)
	delete(b.kv, key)
	b.stats.abandoned++
	return true
}

// register opens an SGLang room; a room still in use is refused.
func (b *bootstrap) register(id uint64, fp string) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if old, ok := b.rooms[id]; ok {
		if old.state != roomFailed {
			return badRequest(FieldBootstrapRoom, "%s %d is already in use on this prefill engine", FieldBootstrapRoom, id)
		}
		old.timer.Stop()
	}
	b.rooms[id] = &room{fingerprint: fp, state: roomPending, settled: make(chan struct{})}
	close(b.added)
	b.added = make(chan struct{})
	return nil
}

// settle ends a pending room as done, holding its KV of n blocks, or as
// failed.
func (b *bootstrap) settle(id uint64, state roomState, reason string, n int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	rm, ok := b.rooms[id]
	if !ok || rm.state != roomPending {
		return
	}
	b.settleLocked(id, rm, state, reason, n)
}

// settleLocked settles a pending room; b.mu is held.
func (b *bootstrap) settleLocked(id uint64, rm *room, state roomState, reason string, n int) {
	rm.state, rm.reason = state, reason
	close(rm.settled)
	// The same timer bounds a done room's hold and how long a failed one
	// is remembered.
	drop := func() {
		if b.rooms[id] != rm {
			return
		}
		delete(b.rooms, id)
		if b.unhold(rm.held) {
			b.stats.expired++
		}
	}
	if state == roomDone && !b.closed {
		rm.held = b.holdKV(n, drop)
		rm.timer = rm.held.timer
		return
	}
	rm.timer = time.AfterFunc(b.holdFor, func() {
		b.mu.Lock()
		defer b.mu.Unlock()
		drop()
	})
}

// abort is an SGLang decode's abort of room id: a pending room fails (its
// prefill's KV will never be read), a done one is freed unread. It
// returns the state it left the room in.
func (b *bootstrap) abort(id uint64) roomState {
	b.mu.Lock()
	defer b.mu.Unlock()
	rm, ok := b.rooms[id]
	switch {
	case !ok:
		return roomUnknown
	case rm.state == roomPending:
		b.settleLocked(id, rm, roomFailed, "the decode request was aborted", 0)
		return roomFailed
	case rm.state == roomDone:
		if b.unhold(rm.held) {
			b.stats.abandoned++
		}
		rm.timer.Stop()
		delete(b.rooms, id)
		return roomUnknown
	}
	return rm.state
}

// holdStats returns the hold accounting.
func (b *bootstrap) holdStats() kvStats {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.stats
}

// roomReply is the body of a room poll.
type roomReply struct {
	State       roomState `json:"state"`
	Fingerprint string    `json:"fingerprint,omitempty"`
	Error       string    `json:"error,omitempty"`
}

// await waits up to wait for room id to appear and settle.
func (b *bootstrap) await(ctx context.Context, id uint64, fp string, wait time.Duration) roomReply {
	t := time.NewTimer(wait)
	defer t.Stop()
	for {
		b.mu.Lock()
		rm, ok := b.rooms[id]
		var ch <-chan struct{}
		switch {
		case !ok:
			ch = b.added
		case rm.state == roomPending:
			ch = rm.settled
		default:
			reply := roomReply{State: rm.state, Fingerprint: rm.fingerprint, Error: rm.reason}
			if rm.state == roomDone && rm.fingerprint == fp {
				b.unhold(rm.held) // the decode has read the KV
				delete(b.rooms, id)
			}
			b.mu.Unlock()
			return reply
		}
		b.mu.Unlock()
		select {
		case <-ch:
		case <-t.C:
			if ok {
				return roomReply{State: roomPending}
			}
			return roomReply{State: roomUnknown}
		case <-ctx.Done():
			return roomReply{State: roomUnknown}
		}
	}
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, _ := json.Marshal(v)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(b)
}

type kvPull struct {
	BlockIDs    []int  `json:"block_ids"`
	Fingerprint string `json:"fingerprint"`
}

type kvReply struct {
	Fingerprint string `json:"fingerprint,omitempty"`
	Error       string `json:"error,omitempty"`
}

func (b *bootstrap) serveKV(w http.ResponseWriter, r *http.Request) {
	var req kvPull
	if err := json.NewDecoder(io.LimitReader(r.Body, 1<<20)).Decode(&req); err != nil {
		writeJSON(w, http.StatusBadRequest, kvReply{Error: err.Error()})
		return
	}
	fp, ok := b.take(r.PathValue("engine"), req.BlockIDs, req.Fingerprint)
	if !ok {
		writeJSON(w, http.StatusNotFound, kvReply{Error: "no such KV blocks"})
		return
	}
	writeJSON(w, http.StatusOK, kvReply{Fingerprint: fp})
}

type kvFreed struct {
	Freed bool `json:"freed"`
}

func (b *bootstrap) serveFree(w http.ResponseWriter, r *http.Request) {
	var req kvPull
	if err := json.NewDecoder(io.LimitReader(r.Body, 1<<20)).Decode(&req); err != nil {
		writeJSON(w, http.StatusBadRequest, kvReply{Error: err.Error()})
		return
	}
	writeJSON(w, http.StatusOK, kvFreed{Freed: b.free(r.PathValue("engine"), req.BlockIDs)})
}

func (b *bootstrap) serveAbort(w http.ResponseWriter, r *http.Request) {
	id, err := strconv.ParseUint(r.PathValue("room"), 10, 64)
	if err != nil {
		writeJSON(w, http.StatusBadRequest, roomReply{Error: "bad room: " + err.Error()})
		return
	}
	writeJSON(w, http.StatusOK, roomReply{State: b.abort(id)})
}

func (b *bootstrap) serveRoom(w http.ResponseWriter, r *http.Request) {
	id, err := strconv.ParseUint(r.PathValue("room"), 10, 64)
	if err != nil {
		writeJSON(w, http.StatusBadRequest, roomReply{Error: "bad room: " + err.Error()})
		return
	}
	q := r.URL.Query()
	wait := roomPollWait
	if s := q.Get("wait"); s != "" {
		if wait, err = time.ParseDuration(s); err != nil || wait < 0 {
			writeJSON(w, http.StatusBadRequest, roomReply{Error: "bad wait"})
			return
		}
	}
	reply := b.await(r.Context(), id, q.Get("fingerprint"), min(wait, maxPollWait))
	status := http.StatusOK
	if reply.State == roomUnknown {
		status = http.StatusNotFound
	}
	writeJSON(w, status, reply)
}

// pullVLLM fetches a vLLM decode's KV from the prefill engine named by its
// kv_transfer_params.
func (e *Engine) pullVLLM(ctx context.Context, leg *pdLeg) error {
	kv := &leg.kv
	addr := net.JoinHostPort(kv.RemoteHost, strconv.Itoa(kv.RemotePort))
	ctx, cancel := context.WithTimeout(ctx, e.cfg.BootstrapTimeout)
	defer cancel()
	body, _ := json.Marshal(kvPull{BlockIDs: kv.RemoteBlockIDs, Fingerprint: leg.fingerprint})
	u := "http://" + addr + PathVLLMKV + url.PathEscape(kv.RemoteEngineID)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u, bytes.NewReader(body))
	if err != nil {
		return kvTransferError("%s: %v", u, err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := e.client.Do(req)
	if err != nil {
		return kvTransferError("reaching prefill engine %s at %s: %v", kv.RemoteEngineID, addr, err)
	}
	defer resp.Body.Close()
	var reply kvReply
	derr := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&reply)
	switch {
	case resp.StatusCode == http.StatusNotFound && derr == nil:
		return kvTransferError("prefill engine at %s holds no KV blocks %s of engine %s (never prefilled, expired, already used, or another engine)",
			addr, describeBlocks(kv.RemoteBlockIDs), kv.RemoteEngineID)
	case resp.StatusCode != http.StatusOK || derr != nil:
		return kvTransferError("prefill engine at %s answered %s", addr, resp.Status)
	case reply.Fingerprint != leg.fingerprint:
		return kvTransferError("KV blocks %s of engine %s hold another prompt's KV",
			describeBlocks(kv.RemoteBlockIDs), kv.RemoteEngineID)
	}
	return nil
}

// awaitRoom long-polls an SGLang decode's bootstrap room until the prefill
// is done. BootstrapTimeout bounds the wait for the room to appear; once it
// has, the prefill ends it as done or failed (or its server goes away).
func (e *Engine) awaitRoom(ctx context.Context, leg *pdLeg) error {
	// SGLang's routers send an IPv6 bootstrap_host bracketed ("[::1]") and
	// its decode side joins host and port as text: take both spellings.
	addr := net.JoinHostPort(strings.TrimSuffix(strings.TrimPrefix(leg.host, "["), "]"), strconv.Itoa(leg.port))
	deadline := time.Now().Add(e.cfg.BootstrapTimeout)
	seen := false
	for {
		wait := roomPollWait
		if !seen {
			left := time.Until(deadline)
			if left <= 0 {
				return kvTransferError("%s %d did not appear on bootstrap server %s within %v",
					FieldBootstrapRoom, leg.room, addr, e.cfg.BootstrapTimeout)
			}
			wait = min(wait, left)
		}
		reply, err := e.pollRoom(ctx, addr, leg, wait)
		if err != nil {
			return err
		}
		switch reply.State {
		case roomUnknown:
		case roomPending:
			seen = true
		case roomDone:
			if reply.Fingerprint != leg.fingerprint {
				return kvTransferError("%s %d on %s holds another prompt's KV", FieldBootstrapRoom, leg.room, addr)
			}
			return nil
		case roomFailed:
			return kvTransferError("the prefill of %s %d on %s failed: %s", FieldBootstrapRoom, leg.room, addr, reply.Error)
		default:
			return kvTransferError("bootstrap server %s answered state %q", addr, reply.State)
		}
	}
}

func (e *Engine) pollRoom(ctx context.Context, addr string, leg *pdLeg, wait time.Duration) (roomReply, error) {
	// The server answers after at most wait; the slack covers the network.
	ctx, cancel := context.WithTimeout(ctx, wait+e.cfg.BootstrapTimeout)
	defer cancel()
	q := url.Values{"fingerprint": {leg.fingerprint}, "wait": {wait.String()}}
	u := "http://" + addr + PathSGLangRoom + strconv.FormatUint(leg.room, 10) + "?" + q.Encode()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return roomReply{}, kvTransferError("%s: %v", u, err)
	}
	resp, err := e.client.Do(req)
	if err != nil {
		return roomReply{}, kvTransferError("reaching bootstrap server %s: %v", addr, err)
	}
	defer resp.Body.Close()
	var reply roomReply
	derr := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&reply)
	okStatus := resp.StatusCode == http.StatusOK ||
		(resp.StatusCode == http.StatusNotFound && reply.State == roomUnknown)
	if derr != nil || !okStatus {
		// Not a simulated bootstrap server: failing now beats spinning
		// until the timeout.
		return roomReply{}, kvTransferError("bootstrap server %s answered %s", addr, resp.Status)
	}
	return reply, nil
}
