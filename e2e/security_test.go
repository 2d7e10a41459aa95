package e2e

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	switchyardv1 "github.com/switchyard-ai/switchyard/api/switchyard/v1"
	"github.com/switchyard-ai/switchyard/internal/cmdtest"
	"github.com/switchyard-ai/switchyard/internal/testwait"
)

// TestAPIKeysAndLimits: every auth and limit case through the real broker
// command, over HTTP and gRPC.
func TestAPIKeysAndLimits(t *testing.T) {
	b := cmdtest.StartBroker(t, "--api-key", "key-one", "--api-key", "key-two", "--max-body", "65536", "--read-header-timeout", "300ms")
	startAgent(t, b.NATS, "a1", fastEngine(t, 4), 4)
	body := `{"model":"sim-model","messages":[{"role":"user","content":"hi"}],"max_tokens":3}`
	do := func(path, key, body string) (*http.Response, string) {
		t.Helper()
		method := "GET"
		if body != "" {
			method = "POST"
		}
		req, _ := http.NewRequest(method, b.HTTP+path, strings.NewReader(body))
		if key != "" {
			req.Header.Set("Authorization", "Bearer "+key)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		data, _ := io.ReadAll(resp.Body)
		return resp, string(data)
	}
	testwait.For(t, 20*time.Second, 20*time.Millisecond, func() error {
		if resp, _ := do("/readyz", "", ""); resp.StatusCode != 200 {
			return fmt.Errorf("readyz %d", resp.StatusCode)
		}
		if resp, _ := do("/v1/models", "key-one", ""); resp.StatusCode != 200 {
			return fmt.Errorf("models %d", resp.StatusCode)
		}
		if resp, data := do("/v1/models", "key-one", ""); !strings.Contains(data, "sim-model") {
			return fmt.Errorf("models %d %s", resp.StatusCode, data)
		}
		return nil
	})

	for _, tc := range []struct {
		name, path, key, body string
		status                int
	}{
		{"no key", "/v1/chat/completions", "", body, 401},
		{"wrong key", "/v1/chat/completions", "key-three", body, 401},
		{"right key", "/v1/chat/completions", "key-one", body, 200},
		{"second key", "/v1/chat/completions", "key-two", body, 200},
		{"fleet needs a key", "/v1/fleet", "", "", 401},
		{"metrics need a key", "/metrics", "", "", 401},
		{"healthz without key", "/healthz", "", "", 200},
		{"readyz without key", "/readyz", "", "", 200},
		{"page shell without key", "/", "", "", 200},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, data := do(tc.path, tc.key, tc.body)
			if resp.StatusCode != tc.status {
				t.Fatalf("status %d body %s, want %d", resp.StatusCode, data, tc.status)
			}
			if tc.status == 401 {
				if resp.Header.Get("WWW-Authenticate") == "" || !strings.Contains(data, `"code":"invalid_api_key"`) {
					t.Fatalf("401 without challenge or OpenAI error: %v %s", resp.Header, data)
				}
				if strings.Contains(data, tc.key) && tc.key != "" {
					t.Fatal("401 echoes the key")
				}
			}
		})
	}

	t.Run("oversized body is cut off, not buffered", func(t *testing.T) {
		// 64 MiB offered against a 64 KiB limit: the broker must answer 413
		// after reading little more than the limit.
		var sent atomic.Int64
		pr, pw := io.Pipe()
		go func() {
			chunk := []byte(strings.Repeat("x", 32<<10))
			_, _ = pw.Write([]byte(`{"messages":[{"role":"user","content":"`))
			for i := 0; i < 2048; i++ {
				n, err := pw.Write(chunk)
				sent.Add(int64(n))
				if err != nil {
					return
				}
			}
			pw.Close()
		}()
		req, _ := http.NewRequest("POST", b.HTTP+"/v1/chat/completions", pr)
		req.Header.Set("Authorization", "Bearer key-one")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("no answer to an oversized body: %v", err)
		}
		data, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		pr.CloseWithError(io.ErrClosedPipe)
		if resp.StatusCode != 413 || !strings.Contains(string(data), "body_too_large") {
			t.Fatalf("status %d %s", resp.StatusCode, data)
		}
		if s := sent.Load(); s > 16<<20 {
			t.Fatalf("client could push %d bytes before the 413", s)
		}
	})

	t.Run("slow header client is cut off", func(t *testing.T) {
		conn, err := net.Dial("tcp", strings.TrimPrefix(b.HTTP, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		if _, err := conn.Write([]byte("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")); err != nil {
			t.Fatal(err)
		}
		// Never finish the headers; the server must hang up on its own.
		_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
		buf := make([]byte, 512)
		for {
			_, err := conn.Read(buf)
			if err == nil {
				continue
			}
			if ne, ok := err.(net.Error); ok && ne.Timeout() {
				t.Fatal("server kept a slow-header connection open for 10s")
			}
			return // closed by the server
		}
	})

	t.Run("grpc", func(t *testing.T) {
		client := grpcClient(t, b.GRPC)
		req := &switchyardv1.ChatRequest{Model: model, Messages: []*switchyardv1.Message{{Role: "user", Content: "hi"}}, MaxTokens: ptr(uint32(3))}
		for _, tc := range []struct {
			name, key string
			code      codes.Code
		}{
			{"no key", "", codes.Unauthenticated},
			{"wrong key", "nope", codes.Unauthenticated},
			{"right key", "key-two", codes.OK},
		} {
			ctx := context.Background()
			if tc.key != "" {
				ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+tc.key)
			}
			s, err := client.Chat(ctx, req)
			if err == nil {
				for {
					if _, err = s.Recv(); err != nil {
						break
					}
				}
				if err == io.EOF {
					err = nil
				}
			}
			if status.Code(err) != tc.code {
				t.Fatalf("%s: %v, want %v", tc.name, err, tc.code)
			}
		}
		cc, err := grpc.NewClient(b.GRPC, grpcInsecure())
		if err != nil {
			t.Fatal(err)
		}
		defer cc.Close()
		h, err := healthpb.NewHealthClient(cc).Check(context.Background(), &healthpb.HealthCheckRequest{})
		if err != nil || h.GetStatus() != healthpb.HealthCheckResponse_SERVING {
			t.Fatalf("health without key: %v %v", h, err)
		}
	})
}

// TestHostileModelNames: a spy on every subject sees no job land anywhere
// for model names made of NATS syntax, and a served model whose id holds a
// dot gets jobs only on its own escaped subject.
func TestHostileModelNames(t *testing.T) {
	b := cmdtest.StartBroker(t)
	startAgent(t, b.NATS, "dotted", startEngine(t, simengineConfig("a.b")), 2, "--model", "a.b")
	startAgent(t, b.NATS, "plain", startEngine(t, simengineConfig("a")), 2, "--model", "a")
	cmdtest.WaitEligible(t, b.HTTP, "dotted", "plain")
	nc, err := nats.Connect(b.NATS)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	var mu sync.Mutex
	var jobs []string
	if _, err := nc.Subscribe(">", func(m *nats.Msg) {
		if strings.HasPrefix(m.Subject, "sy.jobs.") {
			mu.Lock()
			jobs = append(jobs, m.Subject) // the publish, and its delivery to the agent
			mu.Unlock()
		}
	}); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"*", ">", "a.*", "a.>", "a b", "$SYS", "_INBOX.x", "sy.jobs.a.regular", strings.Repeat("m", 10<<10), "\xff\xfe", "a\x00", ""} {
		body := fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"x"}],"max_tokens":2}`, name)
		if name == "\xff\xfe" {
			body = "{\"model\":\"\xff\xfe\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}"
		}
		status, text := post(t, b.HTTP+"/v1/chat/completions", body)
		if status != 400 && status != 404 {
			t.Fatalf("model %.40q: status %d %s", name, status, text)
		}
	}
	status, text := post(t, b.HTTP+"/v1/chat/completions", `{"model":"a.b","messages":[{"role":"user","content":"x"}],"max_tokens":2}`)
	if status != 200 {
		t.Fatalf("served dotted model: %d %s", status, text)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(jobs) == 0 {
		t.Fatal("the spy saw no job at all")
	}
	for _, j := range jobs {
		if j != "sy.jobs.a_2Eb.regular" {
			t.Fatalf("jobs seen on %v; want them only on sy.jobs.a_2Eb.regular", jobs)
		}
	}
}

// TestTLS: with --tls-cert and --tls-key both ingresses speak TLS only.
func TestTLS(t *testing.T) {
	dir := t.TempDir()
	certPEM, keyPEM := selfSigned(t)
	certFile, keyFile := dir+"/cert.pem", dir+"/key.pem"
	if err := os.WriteFile(certFile, certPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, keyPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	b := cmdtest.StartBroker(t, "--tls-cert", certFile, "--tls-key", keyFile)
	if !strings.HasPrefix(b.HTTP, "https://") {
		t.Fatalf("listening on %s", b.HTTP)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(certPEM)
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, ServerName: "127.0.0.1"}}}
	resp, err := client.Get(b.HTTP + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("healthz over TLS: %d", resp.StatusCode)
	}
	if _, err := http.Get(strings.Replace(b.HTTP, "https://", "http://", 1) + "/healthz"); err == nil {
		// Go's server answers plain HTTP on a TLS port with a 400, never
		// with the API.
		resp, _ := http.Get(strings.Replace(b.HTTP, "https://", "http://", 1) + "/healthz")
		if resp != nil && resp.StatusCode == 200 {
			t.Fatal("plain HTTP served on the TLS port")
		}
	}
	cc, err := grpc.NewClient(b.GRPC, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: pool, ServerName: "127.0.0.1"})))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	h, err := healthpb.NewHealthClient(cc).Check(context.Background(), &healthpb.HealthCheckRequest{})
	if err != nil || h.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		// SERVING needs the readiness window; any answer over TLS will do.
		if status.Code(err) == codes.Unavailable {
			t.Fatalf("gRPC over TLS: %v", err)
		}
	}
	plain, _ := grpc.NewClient(b.GRPC, grpcInsecure())
	defer plain.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if _, err := healthpb.NewHealthClient(plain).Check(ctx, &healthpb.HealthCheckRequest{}); err == nil {
		t.Fatal("plaintext gRPC accepted on the TLS port")
	}
}

func selfSigned(t *testing.T) (certPEM, keyPEM []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: "switchyard-test"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		IPAddresses:  []net.IP{net.ParseIP("127.0.0.1")},
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kb, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb})
}
