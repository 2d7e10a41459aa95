package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/switchyard-ai/switchyard/internal/cmdtest"
	"github.com/switchyard-ai/switchyard/internal/testwait"
)

// The tests below speak HTTP/2 frames on raw sockets to the broker's gRPC
// listener, as a hostile client would: no grpc-go client refuses to send
// what they send, nor spends a goroutine per stream.

// h2Client is a raw HTTP/2 client connection.
type h2Client struct {
	c   net.Conn
	fr  *http2.Framer
	mu  sync.Mutex // writes
	enc *hpack.Encoder
	buf bytes.Buffer
	id  uint32

	resets  atomic.Int64 // RST_STREAM frames received
	answers atomic.Int64 // HEADERS frames received
	goaway  atomic.Bool
	closed  chan struct{} // closed when the broker closes the connection
}

// dialH2 connects to addr from the loopback address src ("" for any) and
// sends the HTTP/2 preface; a goroutine reads the broker's frames and
// answers its SETTINGS and pings.
func dialH2(t *testing.T, addr, src string) *h2Client {
	t.Helper()
	d := net.Dialer{Timeout: 10 * time.Second}
	if src != "" {
		d.LocalAddr = &net.TCPAddr{IP: net.ParseIP(src)}
	}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		if src != "" && src != "127.0.0.1" {
			t.Skipf("no loopback address %s here: %v", src, err)
		}
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	h := &h2Client{c: c, fr: http2.NewFramer(c, c), id: 1, closed: make(chan struct{})}
	h.enc = hpack.NewEncoder(&h.buf)
	// A connection the broker refuses may be closed before the preface
	// is written: it is a closed client, which the callers look for.
	_, err = io.WriteString(c, http2.ClientPreface)
	if err == nil {
		err = h.fr.WriteSettings()
	}
	if err != nil {
		t.Logf("connection from %s closed at its preface: %v", src, err)
		close(h.closed)
		return h
	}
	go h.read()
	return h
}

func (h *h2Client) read() {
	defer close(h.closed)
	for {
		f, err := h.fr.ReadFrame()
		if err != nil {
			return
		}
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if !f.IsAck() {
				h.mu.Lock()
				_ = h.fr.WriteSettingsAck()
				h.mu.Unlock()
			}
		case *http2.PingFrame:
			if !f.IsAck() {
				h.mu.Lock()
				_ = h.fr.WritePing(true, f.Data)
				h.mu.Unlock()
			}
		case *http2.RSTStreamFrame:
			h.resets.Add(1)
		case *http2.HeadersFrame:
			h.answers.Add(1)
		case *http2.GoAwayFrame:
			h.goaway.Store(true)
		}
	}
}

// watch opens a health Watch stream with extra header fields and sends
// its request; the stream stays open as long as the broker keeps it.
func (h *h2Client) watch(extra func(*hpack.Encoder)) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.buf.Reset()
	for _, f := range []hpack.HeaderField{
		{Name: ":method", Value: "POST"}, {Name: ":scheme", Value: "http"},
		{Name: ":path", Value: "/grpc.health.v1.Health/Watch"}, {Name: ":authority", Value: "x"},
		{Name: "content-type", Value: "application/grpc"}, {Name: "te", Value: "trailers"},
	} {
		_ = h.enc.WriteField(f)
	}
	if extra != nil {
		extra(h.enc)
	}
	id := h.id
	h.id += 2
	block := h.buf.Bytes()
	for first := true; first || len(block) > 0; first = false {
		n := min(len(block), 16384)
		frag, end := block[:n], n == len(block)
		block = block[n:]
		var err error
		if first {
			err = h.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: frag, EndHeaders: end})
		} else {
			err = h.fr.WriteContinuation(id, end, frag)
		}
		if err != nil {
			return err
		}
	}
	// An empty HealthCheckRequest, and the end of the request.
	return h.fr.WriteData(id, true, []byte{0, 0, 0, 0, 0})
}

// heapInUse is the heap in use after a collection.
func heapInUse() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapInuse
}

// TestGRPCHeaderListBounded: 100 keyless health Watch streams on one
// connection, each with 3000 binary metadata values of 3000 bytes (HPACK
// sends each repeat as one index: a few KB on the wire for 9 MB of
// header list), are reset as their headers arrive and cost the broker no
// memory.
func TestGRPCHeaderListBounded(t *testing.T) {
	b := cmdtest.StartBroker(t, "--api-key", edgeKey)
	before := heapInUse()
	h := dialH2(t, b.GRPC, "")
	val := base64.RawStdEncoding.EncodeToString(bytes.Repeat([]byte{0xab}, 2250)) // 3000 bytes
	const streams = 100
	for i := range streams {
		if err := h.watch(func(e *hpack.Encoder) {
			for range 3000 {
				_ = e.WriteField(hpack.HeaderField{Name: "x-junk-bin", Value: val})
			}
		}); err != nil {
			t.Fatalf("stream %d: %v", i, err)
		}
	}
	testwait.For(t, 20*time.Second, 10*time.Millisecond, func() error {
		if n := h.resets.Load(); n < streams {
			return fmt.Errorf("%d of %d streams reset", n, streams)
		}
		return nil
	})
	grown := int64(heapInUse()) - int64(before)
	t.Logf("heap in use grew %d KiB for %d streams declaring 9 MB of headers each", grown>>10, streams)
	if grown > 64<<20 {
		t.Fatalf("heap in use grew %d MiB", grown>>20)
	}
	// The connection still serves.
	select {
	case <-h.closed:
		t.Fatal("connection closed")
	default:
	}
	answers := h.answers.Load()
	if err := h.watch(nil); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, 10*time.Second, 10*time.Millisecond, func() error {
		if h.answers.Load() == answers {
			return errors.New("no answer to a plain Watch")
		}
		return nil
	})
}

// TestGRPCKeylessStreamsBounded: a client opening 2000 keyless health
// Watch streams over 20 connections gets its share of them and no more;
// the others are refused as their headers arrive, before they cost a
// goroutine. A probe from another client is still answered.
func TestGRPCKeylessStreamsBounded(t *testing.T) {
	b := cmdtest.StartBroker(t, "--api-key", edgeKey)
	before := runtime.NumGoroutine()
	const conns, perConn = 20, 100
	var clients []*h2Client
	for range conns {
		h := dialH2(t, b.GRPC, "127.0.0.2")
		clients = append(clients, h)
		for j := range perConn {
			if err := h.watch(nil); err != nil {
				t.Fatalf("stream %d: %v", j, err)
			}
		}
	}
	// Every stream is answered: the share with the status, the others
	// with RESOURCE_EXHAUSTED.
	testwait.For(t, 30*time.Second, 20*time.Millisecond, func() error {
		n := int64(0)
		for _, h := range clients {
			n += h.answers.Load()
		}
		if n < conns*perConn {
			return fmt.Errorf("%d of %d streams answered", n, conns*perConn)
		}
		return nil
	})
	grown := runtime.NumGoroutine() - before
	t.Logf("%d goroutines more for %d keyless Watch streams on %d connections", grown, conns*perConn, conns)
	// The share, a few per connection (its reader, writer, keepalive and
	// this test's reader), and slack for the broker's own.
	if limit := 64 + 8*conns + 100; grown > limit {
		t.Fatalf("%d goroutines more, want at most %d", grown, limit)
	}
	// A probe from another client (the kubelet's Check) still passes.
	cc, err := grpc.NewClient(b.GRPC, grpcInsecure())
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if r, err := healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{}); err != nil || r.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("probe beside a greedy client: %v %v", r, err)
	}
}

// TestGRPCSilentConnectionsClosed: a connection that does not finish its
// HTTP/2 handshake is closed after --read-header-timeout, and one that
// opens no stream after --idle-timeout (grpc-go's graceful close adds the
// time a ping takes to come back).
func TestGRPCSilentConnectionsClosed(t *testing.T) {
	b := cmdtest.StartBroker(t, "--read-header-timeout", "300ms", "--idle-timeout", "500ms")
	closedWithin := func(t *testing.T, c net.Conn, limit time.Duration) time.Duration {
		t.Helper()
		at := time.Now()
		_ = c.SetReadDeadline(at.Add(limit))
		_, err := io.Copy(io.Discard, c)
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			t.Fatalf("connection still open after %s", time.Since(at))
		}
		return time.Since(at)
	}
	t.Run("half a preface", func(t *testing.T) {
		c, err := net.Dial("tcp", b.GRPC)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		_, _ = io.WriteString(c, "PRI * HTTP/2.0\r\n")
		t.Logf("closed after %s", closedWithin(t, c, 30*time.Second).Round(time.Millisecond))
	})
	t.Run("idle", func(t *testing.T) {
		h := dialH2(t, b.GRPC, "")
		at := time.Now()
		select {
		case <-h.closed:
		case <-time.After(30 * time.Second):
			t.Fatal("idle connection still open after 30s")
		}
		if !h.goaway.Load() {
			t.Error("closed without a GOAWAY")
		}
		t.Logf("closed after %s", time.Since(at).Round(time.Millisecond))
	})
}

// TestConnShareOverBothProtocols: a client's connections count against
// one share over HTTP and gRPC; past it its HTTP connections get 503 and
// its gRPC ones are closed, while another client, the kubelet probing
// /healthz and grpc.health.v1, is served.
func TestConnShareOverBothProtocols(t *testing.T) {
	b := cmdtest.StartBroker(t, "--max-conns", "64", "--max-conns-per-client", "6")
	httpAddr := strings.TrimPrefix(b.HTTP, "http://")
	dial := func(addr string) net.Conn {
		t.Helper()
		c, err := (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.2")}}).Dial("tcp", addr)
		if err != nil {
			t.Skipf("no loopback address 127.0.0.2 here: %v", err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	// The greedy client: three kept-alive HTTP connections, three gRPC
	// ones.
	var greedy []*h2Client
	for i := range 3 {
		c := dial(httpAddr)
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		_, _ = io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("greedy HTTP connection %d within its share: %v %v", i, resp, err)
		}
		resp.Body.Close()
		greedy = append(greedy, dialH2(t, b.GRPC, "127.0.0.2"))
	}
	// Its share is full once the broker has accepted all six: poll with a
	// seventh HTTP connection until it is refused.
	testwait.For(t, 10*time.Second, 20*time.Millisecond, func() error {
		c := dial(httpAddr)
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		_, _ = io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
		head, _ := io.ReadAll(c)
		if !bytes.Contains(head, []byte("503 Service Unavailable")) || !bytes.Contains(head, []byte("--max-conns-per-client")) {
			return fmt.Errorf("seventh connection: %.80q", head)
		}
		return nil
	})
	extra := dialH2(t, b.GRPC, "127.0.0.2")
	select {
	case <-extra.closed:
	case <-time.After(10 * time.Second):
		t.Fatal("gRPC connection past the share still open")
	}
	for i, h := range greedy {
		select {
		case <-h.closed:
			t.Fatalf("gRPC connection %d within the share closed", i)
		default:
		}
	}
	// The kubelet, from another address.
	probe := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	for i := range 10 {
		resp, err := probe.Get(b.HTTP + "/healthz")
		if err != nil {
			t.Fatalf("probe %d: %v", i, err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("probe %d: %d", i, resp.StatusCode)
		}
	}
	cc, err := grpc.NewClient(b.GRPC, grpcInsecure())
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if r, err := healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{}); err != nil || r.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("gRPC probe beside a greedy client: %v %v", r, err)
	}
}
