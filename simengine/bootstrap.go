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
	// or 404. A pull whose fingerprint matches consumes the blocks.
	PathVLLMKV = "/sim/vllm/kv/"
	// PathSGLangRoom + room: an SGLang decode long-polls with GET
	// ?fingerprint=...&wait=<duration>; 200 {"state":"pending"|"done"|
	// "failed",...} or 404 {"state":"unknown"} when the room has not
	// appeared within wait. A poll whose fingerprint matches a done room
	// consumes it.
	PathSGLangRoom = "/sim/sglang/rooms/"
)

const (
	// roomPollWait is the longest a decode's long poll waits per round.
	roomPollWait = time.Second
	maxPollWait  = 10 * time.Second
	sweepEvery   = time.Second
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
	expires     time.Time     // zero while pending
}

type kvEntry struct {
	fingerprint string
	expires     time.Time
}

// bootstrap is a prefill engine's side channel: the hand-offs it holds and
// the HTTP server decode engines reach them through.
type bootstrap struct {
	engineID string
	ttl      time.Duration
	port     int
	srv      *http.Server
	served   chan error

	mu        sync.Mutex
	rooms     map[uint64]*room
	added     chan struct{} // closed and replaced when a room is registered
	kv        map[string]kvEntry
	nextBlock int
	lastSweep time.Time
}

func startBootstrap(e *Engine) (*bootstrap, error) {
	addr := net.JoinHostPort(e.cfg.BootstrapHost, strconv.Itoa(e.cfg.BootstrapPort))
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("simengine: bootstrap listener: %w", err)
	}
	b := &bootstrap{
		engineID: e.engineID,
		ttl:      e.handoffTTL,
		port:     ln.Addr().(*net.TCPAddr).Port,
		served:   make(chan error, 1),
		rooms:    make(map[uint64]*room),
		added:    make(chan struct{}),
		kv:       make(map[string]kvEntry),
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+PathBootstrapHealth, func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusOK)
	})
	mux.HandleFunc("POST "+PathVLLMKV+"{engine}", b.serveKV)
	mux.HandleFunc("GET "+PathSGLangRoom+"{room}", b.serveRoom)
	b.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() { b.served <- b.srv.Serve(ln) }()
	return b, nil
}

// close stops the server at once: cutting the long polls is what makes a
// waiting decode fail promptly.
func (b *bootstrap) close() error {
	err := b.srv.Close()
	if serr := <-b.served; !errors.Is(serr, http.ErrServerClosed) && err == nil {
		err = serr
	}
	return err
}

// sweep drops expired hand-offs, at most once per sweepEvery; b.mu is held.
func (b *bootstrap) sweep(now time.Time) {
	if now.Sub(b.lastSweep) < sweepEvery {
		return
	}
	b.lastSweep = now
	for k, v := range b.kv {
		if now.After(v.expires) {
			delete(b.kv, k)
		}
	}
	for k, v := range b.rooms {
		if !v.expires.IsZero() && now.After(v.expires) {
			delete(b.rooms, k)
		}
	}
}

// put stores a vLLM prefill's fingerprint under n fresh block ids.
func (b *bootstrap) put(n int, fp string) []int {
	ids := make([]int, n)
	now := time.Now()
	b.mu.Lock()
	defer b.mu.Unlock()
	b.sweep(now)
	for i := range ids {
		b.nextBlock++
		ids[i] = b.nextBlock
	}
	b.kv[blockKey(b.engineID, ids)] = kvEntry{fingerprint: fp, expires: now.Add(b.ttl)}
	return ids
}

// take looks the blocks up, consuming them when fp matches.
func (b *bootstrap) take(engineID string, ids []int, fp string) (stored string, ok bool) {
	if engineID != b.engineID {
		return "", false
	}
	key := blockKey(engineID, ids)
	now := time.Now()
	b.mu.Lock()
	defer b.mu.Unlock()
	v, ok := b.kv[key]
	if !ok || now.After(v.expires) {
		delete(b.kv, key)
		return "", false
	}
	if v.fingerprint == fp {
		delete(b.kv, key)
	}
	return v.fingerprint, true
}

// register opens an SGLang room; a room still in use is refused.
func (b *bootstrap) register(id uint64, fp string) error {
	now := time.Now()
	b.mu.Lock()
	defer b.mu.Unlock()
	b.sweep(now)
	if old, ok := b.rooms[id]; ok && old.state != roomFailed {
		return badRequest(FieldBootstrapRoom, "%s %d is already in use on this prefill engine", FieldBootstrapRoom, id)
	}
	b.rooms[id] = &room{fingerprint: fp, state: roomPending, settled: make(chan struct{})}
	close(b.added)
	b.added = make(chan struct{})
	return nil
}

// settle ends a pending room as done or failed.
func (b *bootstrap) settle(id uint64, state roomState, reason string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	rm, ok := b.rooms[id]
	if !ok || rm.state != roomPending {
		return
	}
	rm.state, rm.reason = state, reason
	rm.expires = time.Now().Add(b.ttl)
	close(rm.settled)
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
