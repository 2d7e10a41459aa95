package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"net"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/switchyard-ai/switchyard/loadgen"
)

const model = "sim-model"

// transport mirrors loadgen's own (one HTTP/1.1 connection per stream,
// no compression); with several hosts it sends each request to the next
// one in turn, which is how "direct" spreads load over the engines from
// the client side with no proxy in between.
type transport struct {
	base  *http.Transport
	hosts []string
	next  atomic.Uint64
}

func newTransport(conns int, hosts ...string) *transport {
	d := &net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}
	return &transport{base: &http.Transport{
		DialContext:         d.DialContext,
		DisableCompression:  true,
		MaxIdleConns:        conns,
		MaxIdleConnsPerHost: conns,
		IdleConnTimeout:     90 * time.Second,
		ReadBufferSize:      32 << 10,
		WriteBufferSize:     16 << 10,
	}, hosts: hosts}
}

func (t *transport) RoundTrip(r *http.Request) (*http.Response, error) {
	if len(t.hosts) > 1 {
		r = r.Clone(r.Context())
		r.URL.Host = t.hosts[(t.next.Add(1)-1)%uint64(len(t.hosts))]
		r.Host = r.URL.Host
	}
	return t.base.RoundTrip(r)
}

// load runs cfg against a front end and returns the report and, when
// asked, the per-request records of the measured requests.
func (e *env) load(cfg loadgen.Config, wantRaw bool, hosts ...string) (*loadgen.Report, []loadgen.RawRecord, error) {
	conns := max(cfg.Concurrency, 1024)
	tr := newTransport(conns, hosts...)
	defer tr.base.CloseIdleConnections()
	var raw bytes.Buffer
	opts := []loadgen.Option{loadgen.WithHTTPClient(&http.Client{Transport: tr})}
	if wantRaw {
		opts = append(opts, loadgen.WithRawOut(&raw))
	}
	rep, err := loadgen.Run(e.ctx, cfg, opts...)
	if err != nil {
		return rep, nil, err
	}
	var recs []loadgen.RawRecord
	sc := bufio.NewScanner(&raw)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		var r loadgen.RawRecord
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			return rep, nil, err
		}
		if !r.Warmup {
			recs = append(recs, r)
		}
	}
	return rep, recs, nil
}
