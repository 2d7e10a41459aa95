package simengine

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
)

// Role is an engine's part in prefill/decode disaggregation.
type Role string

// Roles.
const (
	// RoleRegular serves whole requests; PD fields are ignored.
	RoleRegular Role = "regular"
	// RolePrefill serves only the prefill leg of a PD request and hands
	// the KV over through its bootstrap side channel.
	RolePrefill Role = "prefill"
	// RoleDecode serves only the decode leg, after receiving the KV.
	RoleDecode Role = "decode"
)

// PDProtocol is the hand-off protocol of prefill and decode engines.
type PDProtocol string

// Protocols.
const (
	// PDVLLM is vLLM's NixlConnector style: the prefill response carries
	// kv_transfer_params that the decode request passes on.
	PDVLLM PDProtocol = "vllm"
	// PDSGLang is SGLang's bootstrap style: both legs carry the prefill
	// engine's bootstrap host, port and a room chosen by the router, and
	// run at the same time.
	PDSGLang PDProtocol = "sglang"
)

// Request and response field names of the hand-off protocols.
const (
	// FieldKVTransferParams is the vLLM object, in the prefill request,
	// the prefill response (top level) and the decode request.
	FieldKVTransferParams = "kv_transfer_params"
	FieldDoRemoteDecode   = "do_remote_decode"
	FieldDoRemotePrefill  = "do_remote_prefill"
	FieldRemoteEngineID   = "remote_engine_id"
	FieldRemoteBlockIDs   = "remote_block_ids"
	FieldRemoteHost       = "remote_host"
	FieldRemotePort       = "remote_port"
	FieldTPSize           = "tp_size"

	// SGLang's fields, in both legs' request bodies.
	FieldBootstrapHost = "bootstrap_host"
	FieldBootstrapPort = "bootstrap_port"
	FieldBootstrapRoom = "bootstrap_room"

	// CodeKVTransferFailed is the error code of a failed hand-off, in the
	// HTTP error body and in a streaming error event.
	CodeKVTransferFailed = "kv_transfer_failed"
)

// KVTransferParams is vLLM's kv_transfer_params object. A router's prefill
// request sets only DoRemoteDecode (the remote_* fields may be null); the
// prefill response returns every field, with DoRemotePrefill set, for the
// decode request to carry unchanged.
type KVTransferParams struct {
	DoRemoteDecode  bool   `json:"do_remote_decode"`
	DoRemotePrefill bool   `json:"do_remote_prefill"`
	RemoteEngineID  string `json:"remote_engine_id"`
	RemoteBlockIDs  []int  `json:"remote_block_ids"`
	RemoteHost      string `json:"remote_host"`
	RemotePort      int    `json:"remote_port"`
	TPSize          int    `json:"tp_size"`
}

// KVBlockSize is how many prompt tokens one simulated KV block holds
// (vLLM's default block size): a hand-off of p prompt tokens holds
// ceil(p/16) blocks, at least 1.
const KVBlockSize = 16

func kvBlocks(promptTokens int) int {
	return max(1, (promptTokens+KVBlockSize-1)/KVBlockSize)
}

// pdLeg is a PD request's validated hand-off data.
type pdLeg struct {
	role        Role
	proto       PDProtocol
	fingerprint string

	kv KVTransferParams // vLLM

	host string // SGLang
	port int
	room uint64

	// prefilled is set by the prefill leg once its KV is ready, and
	// finished once it returns its last token: a vLLM prefill aborted in
	// between frees its KV at once, as vLLM does for a request that does
	// not finish by length.
	prefilled, finished bool
	blockIDs            []int // vLLM prefill: the KV it holds
	// received is set by the decode leg once it has its KV.
	received bool
	// extra is appended to the last chunk or response (vLLM prefill).
	extra []byte
}

// fingerprint stands for a prompt's KV: a hash of the model and the
// prompt words, so that a decode receiving another prompt's KV notices.
func fingerprint(model, prompt string) string {
	h := fnvString(fnvOffset64, "switchyard-sim/kv\x00")
	h = fnvString(h, model)
	for w := range strings.FieldsSeq(prompt) {
		h *= fnvPrime64 // a zero byte between words
		h = fnvString(h, w)
	}
	return strconv.FormatUint(h, 16)
}

// checkPD validates a request's hand-off fields for a PD engine.
func (e *Engine) checkPD(r *request) *Error {
	if r.n > 1 {
		return badRequest("n", "n must be 1 on a %s engine: a hand-off carries one sequence, got %d", e.cfg.Role, r.n)
	}
	leg := &pdLeg{
		role:        e.cfg.Role,
		proto:       e.cfg.PDProtocol,
		fingerprint: fingerprint(e.cfg.Model, r.prompt),
	}
	var err *Error
	switch leg.proto {
	case PDVLLM:
		err = e.checkVLLM(r, leg)
	case PDSGLang:
		err = e.checkSGLang(r, leg)
	}
	if err != nil {
		return err
	}
	r.pd = leg
	return nil
}

func (e *Engine) checkVLLM(r *request, leg *pdLeg) *Error {
	const p = FieldKVTransferParams
	raw := r.pdRaw.KVTransferParams
	if isNull(raw) {
		if leg.role == RolePrefill {
			return badRequest(p, "this is a vLLM prefill-only engine: the request needs %s.%s=true", p, FieldDoRemoteDecode)
		}
		return badRequest(p, "this is a vLLM decode-only engine: the request needs the %s returned by a prefill engine", p)
	}
	if err := json.Unmarshal(raw, &leg.kv); err != nil {
		return badRequest(p, "invalid %s: %v", p, err)
	}
	kv := &leg.kv
	if leg.role == RolePrefill {
		if !kv.DoRemoteDecode || kv.DoRemotePrefill {
			return badRequest(p, "this is a vLLM prefill-only engine: the request needs %s.%s=true and %s false",
				p, FieldDoRemoteDecode, FieldDoRemotePrefill)
		}
		if r.stream {
			return badRequest("stream", "the prefill leg must not stream: its response carries %s", p)
		}
		return nil
	}
	switch {
	case !kv.DoRemotePrefill || kv.DoRemoteDecode:
		return badRequest(p, "this is a vLLM decode-only engine: %s.%s must be true and %s false",
			p, FieldDoRemotePrefill, FieldDoRemoteDecode)
	case kv.RemoteEngineID == "":
		return badRequest(p, "%s.%s is required", p, FieldRemoteEngineID)
	case len(kv.RemoteBlockIDs) == 0:
		return badRequest(p, "%s.%s must be a non-empty array", p, FieldRemoteBlockIDs)
	case kv.RemoteHost == "":
		return badRequest(p, "%s.%s is required", p, FieldRemoteHost)
	case kv.RemotePort < 1 || kv.RemotePort > 65535:
		return badRequest(p, "%s.%s must be a port number, got %d", p, FieldRemotePort, kv.RemotePort)
	}
	return nil
}

func (e *Engine) checkSGLang(r *request, leg *pdLeg) *Error {
	what := "prefill-only"
	if leg.role == RoleDecode {
		what = "decode-only"
	}
	missing := func(field string) *Error {
		return badRequest(field, "this is an SGLang %s engine: the request needs %s, %s and %s",
			what, FieldBootstrapHost, FieldBootstrapPort, FieldBootstrapRoom)
	}
	raw := r.pdRaw
	if isNull(raw.BootstrapHost) {
		return missing(FieldBootstrapHost)
	}
	if isNull(raw.BootstrapPort) {
		return missing(FieldBootstrapPort)
	}
	if isNull(raw.BootstrapRoom) {
		return missing(FieldBootstrapRoom)
	}
	if json.Unmarshal(raw.BootstrapHost, &leg.host) != nil || leg.host == "" {
		return badRequest(FieldBootstrapHost, "%s must be a non-empty string", FieldBootstrapHost)
	}
	if json.Unmarshal(raw.BootstrapPort, &leg.port) != nil || leg.port < 1 || leg.port > 65535 {
		return badRequest(FieldBootstrapPort, "%s must be a port number", FieldBootstrapPort)
	}
	// A uint64 field decodes the number literal exactly, never through a
	// float64, so rooms up to 2^64-1 survive.
	if json.Unmarshal(raw.BootstrapRoom, &leg.room) != nil {
		return badRequest(FieldBootstrapRoom, "%s must be an integer in [0, 2^64)", FieldBootstrapRoom)
	}
	if leg.role == RolePrefill {
		// SGLang's prefill leg ends with its first token; routers discard
		// its answer.
		r.maxTokens = 1
	}
	return nil
}

// beginPrefill registers an SGLang room as the prefill leg starts.
func (e *Engine) beginPrefill(r *request) error {
	if r.pd.proto != PDSGLang {
		return nil
	}
	return e.bootstrap.register(r.pd.room, r.pd.fingerprint)
}

// prefilled publishes the hand-off once the prefill's KV is ready.
func (e *Engine) prefilled(r *request, promptTokens int) {
	leg := r.pd
	leg.prefilled = true
	switch leg.proto {
	case PDSGLang:
		e.bootstrap.settle(leg.room, roomDone, "", kvBlocks(promptTokens))
	case PDVLLM:
		leg.blockIDs = e.bootstrap.put(kvBlocks(promptTokens), leg.fingerprint)
		kv, _ := json.Marshal(KVTransferParams{
			DoRemotePrefill: true,
			RemoteEngineID:  e.engineID,
			RemoteBlockIDs:  leg.blockIDs,
			RemoteHost:      e.cfg.BootstrapHost,
			RemotePort:      e.bootstrap.port,
			TPSize:          1,
		})
		leg.extra = append([]byte(`,"`+FieldKVTransferParams+`":`), kv...)
	}
}

// endPrefill fails an SGLang room whose prefill ended before its KV was
// ready, and frees the KV of a vLLM prefill aborted before its last token
// (vLLM holds KV only for a request that finished by length; an aborted
// one has no hand-off to read). A prefill aborted later, such as one whose
// response could not be written, keeps holding its KV until the hold
// timeout: vLLM ignores an abort of a finished request.
func (e *Engine) endPrefill(r *request, err error) {
	leg := r.pd
	switch {
	case leg.proto == PDSGLang && !leg.prefilled:
		reason := "the prefill request ended before its KV was ready"
		if err != nil {
			reason += ": " + err.Error()
		}
		e.bootstrap.settle(leg.room, roomFailed, reason, 0)
	case leg.proto == PDVLLM && leg.prefilled && !leg.finished && err != nil:
		e.bootstrap.free(e.engineID, leg.blockIDs)
	}
}

// abandonKV tells the prefill engine that an aborted decode request will
// never read its KV, so that it frees it at once, as real decode engines
// do: vLLM's NixlConnector notifies the prefill of a request aborted
// before its KV was read (request_finished with do_remote_prefill still
// set), and SGLang's decode sends an abort for its bootstrap room. Best
// effort: a prefill that cannot be reached frees the KV at its hold
// timeout.
func (e *Engine) abandonKV(ctx context.Context, r *request) {
	leg := r.pd
	var (
		addr, u string
		body    []byte
	)
	if leg.proto == PDVLLM {
		addr = net.JoinHostPort(leg.kv.RemoteHost, strconv.Itoa(leg.kv.RemotePort))
		u = "http://" + addr + PathVLLMKV + url.PathEscape(leg.kv.RemoteEngineID) + PathFree
		body, _ = json.Marshal(kvPull{BlockIDs: leg.kv.RemoteBlockIDs})
	} else {
		addr = net.JoinHostPort(leg.host, strconv.Itoa(leg.port))
		u = "http://" + addr + PathSGLangRoom + strconv.FormatUint(leg.room, 10) + PathAbort
	}
	// The request's context is done; the notice gets a bounded one.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), e.cfg.BootstrapTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u, bytes.NewReader(body))
	if err == nil {
		req.Header.Set("Content-Type", "application/json")
		var resp *http.Response
		if resp, err = e.client.Do(req); err == nil {
			_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				err = fmt.Errorf("%s", resp.Status)
			}
		}
	}
	if err != nil {
		e.log.Warn("telling the prefill engine to free an aborted decode's KV", "prefill", addr, "error", err)
	}
}

// receiveKV waits for and checks the KV of a decode request.
func (e *Engine) receiveKV(ctx context.Context, r *request) error {
	leg := r.pd
	if leg.proto == PDVLLM {
		return e.pullVLLM(ctx, leg)
	}
	return e.awaitRoom(ctx, leg)
}

func blockKey(engineID string, ids []int) string {
	b := make([]byte, 0, len(engineID)+8*len(ids))
	b = append(b, engineID...)
	for _, id := range ids {
		b = append(b, ',')
		b = strconv.AppendInt(b, int64(id), 10)
	}
	return string(b)
}

func describeBlocks(ids []int) string {
	if len(ids) > 8 {
		return fmt.Sprintf("%v... (%d blocks)", ids[:8], len(ids))
	}
	return fmt.Sprint(ids)
}
