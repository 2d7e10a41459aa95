package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"os/signal"
	"regexp"
	"strings"
	"sync/atomic"
	"syscall"
	"time"
)

// The Go proxy is the plainest front end written in Go: Go's net/http
// server in front, an http.Transport behind, round robin over the engines,
// each chunk flushed as it comes (httputil.ReverseProxy with
// FlushInterval -1), and the runtime at Go's defaults as the environment
// leaves it. It has no NATS, no validation and no JSON: whatever
// Switchyard's front end costs beyond it is Switchyard's; what it costs
// beyond nginx is Go's net/http and runtime on this machine. The broker serves HTTP with the same
// net/http.

// goproxyArg is the re-executed form of this program that serves the Go
// proxy: "__goproxy HOST:PORT[,HOST:PORT...]".
const goproxyArg = "__goproxy"

var goproxyListening = regexp.MustCompile(`^goproxy listening on (\S+)$`)

// newGoProxy returns a reverse proxy that sends each request to the next
// of upstreams (host:port) in turn and streams its response back.
func newGoProxy(upstreams []string) (*httputil.ReverseProxy, error) {
	if len(upstreams) == 0 {
		return nil, errors.New("goproxy: no upstreams")
	}
	targets := make([]*url.URL, len(upstreams))
	for i, u := range upstreams {
		t, err := url.Parse("http://" + u)
		if err != nil || t.Host == "" {
			return nil, fmt.Errorf("goproxy: upstream %q: want host:port", u)
		}
		targets[i] = t
	}
	var next atomic.Uint64
	return &httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) {
			r.SetURL(targets[(next.Add(1)-1)%uint64(len(targets))])
		},
		// Kept-alive connections to the engines, as many as nginx's
		// keepalive 1024; no gzip, as nginx passes bytes through.
		Transport: &http.Transport{
			MaxIdleConns: 4096, MaxIdleConnsPerHost: 1024, IdleConnTimeout: 120 * time.Second,
			DisableCompression: true,
		},
		FlushInterval: -1,
	}, nil
}

// fullDuplex lets h read the request's body after it starts the response.
// Without it Go's HTTP/1 server closes the body when the proxy writes the
// engine's response head, and if the Transport has not yet made its last
// read of the body (the check that it ends where Content-Length says) that
// read fails and the Transport closes the engine's connection, response and
// all: the client gets a stream cut after its first chunk (golang/go#40747;
// about 1% of requests at 64 streams in the runner).
func fullDuplex(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_ = http.NewResponseController(w).EnableFullDuplex()
		h.ServeHTTP(w, r)
	})
}

// runGoProxy serves the Go proxy on a random loopback port until SIGTERM
// or SIGINT, after printing the address.
func runGoProxy(upstreams string) error {
	sigCtx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	p, err := newGoProxy(strings.Split(upstreams, ","))
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: fullDuplex(p), ReadHeaderTimeout: 10 * time.Second}
	fmt.Printf("goproxy listening on %s\n", ln.Addr())
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-sigCtx.Done():
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		return srv.Shutdown(ctx)
	}
}

// startGoProxy starts the Go proxy in front of engines and returns its URL
// and process id.
func (e *env) startGoProxy(tag string, engines []string) (string, int, error) {
	p, err := e.sup.start("goproxy-"+tag, e.self, goproxyArg, strings.Join(engines, ","))
	if err != nil {
		return "", 0, err
	}
	m, err := p.waitFor(e.ctx, goproxyListening, 20*time.Second)
	if err != nil {
		return "", 0, err
	}
	u := "http://" + m[1]
	if err := e.waitHTTP(u + "/v1/models"); err != nil {
		return "", 0, fmt.Errorf("goproxy: %w", err)
	}
	return u, p.pid(), nil
}
