package auth

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"errors"
	"flag"
	"io"
	"log"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	testpb "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/reflection"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	reflectionalphapb "google.golang.org/grpc/reflection/grpc_reflection_v1alpha"
	"google.golang.org/grpc/status"

	"github.com/switchyard-ai/switchyard/internal/testwait"
)

const goodKey = "sk-test-0123456789abcdef"

func mustKeys(t *testing.T, keys ...string) *Keys {
	t.Helper()
	k, err := LoadKeys(keys, "")
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func TestLoadKeysFile(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "keys")
	content := "# Switchyard API keys\n\n  key-one  \nkey-two\n# key-disabled\n\t\nkey-one\nkey#with-hash\n"
	if err := os.WriteFile(file, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	k, err := LoadKeys([]string{"key-flag", "key-two"}, file)
	if err != nil {
		t.Fatal(err)
	}
	if k.Len() != 4 { // key-flag, key-two, key-one, key#with-hash
		t.Errorf("Len = %d, want 4", k.Len())
	}
	for _, ok := range []string{"key-one", "key-two", "key-flag", "key#with-hash"} {
		if !k.Valid(ok) {
			t.Errorf("Valid(%q) = false", ok)
		}
	}
	for _, bad := range []string{"", "key-disabled", "# key-disabled", "key-on", "key-one ", "KEY-ONE"} {
		if k.Valid(bad) {
			t.Errorf("Valid(%q) = true", bad)
		}
	}

	tests := []struct {
		name    string
		keys    []string
		file    string
		wantErr bool
	}{
		{"none", nil, "", false},
		{"empty flag value", []string{""}, "", true},
		{"space inside", []string{"a b"}, "", true},
		{"missing file", nil, filepath.Join(dir, "missing"), true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			k, err := LoadKeys(tt.keys, tt.file)
			if (err != nil) != tt.wantErr {
				t.Fatalf("err = %v, wantErr %v", err, tt.wantErr)
			}
			if err != nil && !errors.Is(err, ErrBadKey) {
				t.Errorf("err = %v, want ErrBadKey", err)
			}
			if err == nil && k.Enabled() {
				t.Error("no keys but enabled")
			}
		})
	}
}

func TestKeyFlag(t *testing.T) {
	var kf KeyFlag
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	fs.Var(&kf, "api-key", "")
	if err := fs.Parse([]string{"--api-key", "a", "--api-key", "b"}); err != nil {
		t.Fatal(err)
	}
	if len(kf) != 2 || strings.Contains(kf.String(), "a") {
		t.Errorf("KeyFlag = %v, String %q", []string(kf), kf.String())
	}
}

func TestHTTP(t *testing.T) {
	var sawAuth string
	next := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sawAuth = r.Header.Get("Authorization")
		io.WriteString(w, "ok")
	})
	h := mustKeys(t, goodKey, "second-key").HTTP(next, "/healthz", "/readyz")

	tests := []struct {
		name       string
		path, auth string
		wantCode   int
	}{
		{"no key", "/v1/chat/completions", "", 401},
		{"wrong key", "/v1/chat/completions", "Bearer nope", 401},
		{"prefix of key", "/v1/models", "Bearer " + goodKey[:len(goodKey)-1], 401},
		{"basic scheme", "/v1/models", "Basic " + goodKey, 401},
		{"bearer without key", "/v1/models", "Bearer ", 401},
		{"right key", "/v1/chat/completions", "Bearer " + goodKey, 200},
		{"second key, lower-case scheme", "/v1/models", "bearer second-key", 200},
		{"exempt healthz", "/healthz", "", 200},
		{"exempt readyz with a wrong key", "/readyz", "Bearer nope", 200},
		{"exempt is exact", "/healthz/x", "", 401},
		{"metrics not exempt", "/metrics", "", 401},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sawAuth = "unset"
			req := httptest.NewRequest("POST", tt.path, strings.NewReader("{}"))
			if tt.auth != "" {
				req.Header.Set("Authorization", tt.auth)
			}
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			if rec.Code != tt.wantCode {
				t.Fatalf("code = %d, want %d; body %s", rec.Code, tt.wantCode, rec.Body)
			}
			if tt.wantCode == 200 {
				if !strings.HasPrefix(tt.path, "/healthz") && !strings.HasPrefix(tt.path, "/readyz") && sawAuth != "" {
					t.Errorf("handler saw Authorization %q, want it removed", sawAuth)
				}
				return
			}
			if sawAuth != "unset" {
				t.Error("handler ran for a refused request")
			}
			if got := rec.Header().Get("WWW-Authenticate"); !strings.HasPrefix(got, "Bearer") {
				t.Errorf("WWW-Authenticate = %q", got)
			}
			if ct := rec.Header().Get("Content-Type"); ct != "application/json" {
				t.Errorf("Content-Type = %q", ct)
			}
			var body struct {
				Error struct {
					Message string  `json:"message"`
					Type    string  `json:"type"`
					Param   *string `json:"param"`
					Code    string  `json:"code"`
				} `json:"error"`
			}
			raw := rec.Body.Bytes()
			if err := json.Unmarshal(raw, &body); err != nil {
				t.Fatalf("body %s: %v", raw, err)
			}
			if body.Error.Type != "invalid_request_error" || body.Error.Code != "invalid_api_key" || body.Error.Param != nil || body.Error.Message == "" {
				t.Errorf("error body = %s", raw)
			}
			if !strings.Contains(string(raw), `"param":null`) {
				t.Errorf("param not null: %s", raw)
			}
			if strings.Contains(string(raw), "nope") {
				t.Errorf("body echoes the presented key: %s", raw)
			}
		})
	}
}

func TestHTTPNoKeysPassThrough(t *testing.T) {
	next := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(204) })
	for _, k := range []*Keys{nil, mustKeys(t)} {
		rec := httptest.NewRecorder()
		k.HTTP(next).ServeHTTP(rec, httptest.NewRequest("GET", "/v1/models", nil))
		if rec.Code != 204 {
			t.Errorf("code = %d, want pass-through", rec.Code)
		}
	}
}

// testService is a minimal grpc.testing service: one unary and one
// server-streaming method.
type testService struct {
	testpb.UnimplementedTestServiceServer
}

func (testService) EmptyCall(context.Context, *testpb.Empty) (*testpb.Empty, error) {
	return &testpb.Empty{}, nil
}

func (testService) StreamingOutputCall(_ *testpb.StreamingOutputCallRequest, s testpb.TestService_StreamingOutputCallServer) error {
	return s.Send(&testpb.StreamingOutputCallResponse{})
}

func startGRPC(t *testing.T, k *Keys, opts ...grpc.ServerOption) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	opts = append(opts, grpc.UnaryInterceptor(k.UnaryInterceptor()), grpc.StreamInterceptor(k.StreamInterceptor()))
	srv := grpc.NewServer(opts...)
	healthpb.RegisterHealthServer(srv, health.NewServer())
	testpb.RegisterTestServiceServer(srv, testService{})
	reflection.Register(srv)
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(srv.Stop)
	return ln.Addr().String()
}

func dial(t *testing.T, addr string, creds credentials.TransportCredentials) *grpc.ClientConn {
	t.Helper()
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}

func TestGRPCInterceptors(t *testing.T) {
	addr := startGRPC(t, mustKeys(t, goodKey))
	cc := dial(t, addr, insecure.NewCredentials())
	tc := testpb.NewTestServiceClient(cc)
	hc := healthpb.NewHealthClient(cc)

	withKey := func(auth string) context.Context {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		t.Cleanup(cancel)
		if auth == "" {
			return ctx
		}
		return metadata.AppendToOutgoingContext(ctx, "authorization", auth)
	}
	tests := []struct {
		name string
		auth string
		want codes.Code
	}{
		{"no key", "", codes.Unauthenticated},
		{"wrong key", "Bearer nope", codes.Unauthenticated},
		{"no scheme", goodKey, codes.Unauthenticated},
		{"right key", "Bearer " + goodKey, codes.OK},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := tc.EmptyCall(withKey(tt.auth), &testpb.Empty{})
			if got := status.Code(err); got != tt.want {
				t.Errorf("unary: code %v (%v), want %v", got, err, tt.want)
			}
			stream, err := tc.StreamingOutputCall(withKey(tt.auth), &testpb.StreamingOutputCallRequest{})
			if err == nil {
				_, err = stream.Recv()
			}
			if got := status.Code(err); got != tt.want {
				t.Errorf("stream: code %v (%v), want %v", got, err, tt.want)
			}
		})
	}

	t.Run("health exempt", func(t *testing.T) {
		if _, err := hc.Check(withKey(""), &healthpb.HealthCheckRequest{}); err != nil {
			t.Errorf("health Check without key: %v", err)
		}
		w, err := hc.Watch(withKey(""), &healthpb.HealthCheckRequest{})
		if err == nil {
			_, err = w.Recv()
		}
		if err != nil {
			t.Errorf("health Watch without key: %v", err)
		}
	})

	// grpcurl resolves a method through reflection before calling it, so
	// "grpcurl -plaintext host:port grpc.health.v1.Health/Check" works
	// without a key only if reflection does too.
	t.Run("reflection exempt", func(t *testing.T) {
		rc, err := reflectionpb.NewServerReflectionClient(cc).ServerReflectionInfo(withKey(""))
		if err != nil {
			t.Fatal(err)
		}
		for _, req := range []*reflectionpb.ServerReflectionRequest{
			{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}},
			{MessageRequest: &reflectionpb.ServerReflectionRequest_FileContainingSymbol{FileContainingSymbol: "grpc.health.v1.Health"}},
		} {
			if err := rc.Send(req); err != nil {
				t.Fatal(err)
			}
			resp, err := rc.Recv()
			if err != nil {
				t.Fatalf("reflection v1 without key: %v", err)
			}
			if e := resp.GetErrorResponse(); e != nil {
				t.Fatalf("reflection v1 %T: %s", req.MessageRequest, e.GetErrorMessage())
			}
		}
		// Older clients fall back to v1alpha.
		ra, err := reflectionalphapb.NewServerReflectionClient(cc).ServerReflectionInfo(withKey(""))
		if err != nil {
			t.Fatal(err)
		}
		if err := ra.Send(&reflectionalphapb.ServerReflectionRequest{MessageRequest: &reflectionalphapb.ServerReflectionRequest_ListServices{}}); err != nil {
			t.Fatal(err)
		}
		resp, err := ra.Recv()
		if err != nil {
			t.Fatalf("reflection v1alpha without key: %v", err)
		}
		if len(resp.GetListServicesResponse().GetService()) == 0 {
			t.Errorf("reflection v1alpha lists no service: %v", resp)
		}
		if _, err := hc.Check(withKey(""), &healthpb.HealthCheckRequest{}); err != nil {
			t.Errorf("health Check after reflection, without key: %v", err)
		}
		// The exemption is by service: the API itself still needs a key.
		if _, err := tc.EmptyCall(withKey(""), &testpb.Empty{}); status.Code(err) != codes.Unauthenticated {
			t.Errorf("API call without key after reflection: %v, want Unauthenticated", err)
		}
	})
}

func TestGRPCNoKeysPassThrough(t *testing.T) {
	addr := startGRPC(t, nil)
	tc := testpb.NewTestServiceClient(dial(t, addr, insecure.NewCredentials()))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := tc.EmptyCall(ctx, &testpb.Empty{}); err != nil {
		t.Fatalf("no keys: %v", err)
	}
}

// selfSigned writes a certificate for 127.0.0.1 and its key into dir.
func selfSigned(t *testing.T, dir, cn string) (certFile, keyFile string, cert *x509.Certificate) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(time.Now().UnixNano()),
		Subject:               pkix.Name{CommonName: cn},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses:           []net.IP{net.IPv4(127, 0, 0, 1)},
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ = x509.ParseCertificate(der)
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = filepath.Join(dir, cn+".pem"), filepath.Join(dir, cn+"-key.pem")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600); err != nil {
		t.Fatal(err)
	}
	return certFile, keyFile, cert
}

func TestTLSConfig(t *testing.T) {
	dir := t.TempDir()
	certFile, keyFile, cert := selfSigned(t, dir, "server")
	cfg, err := TLSConfig(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.MinVersion != tls.VersionTLS12 {
		t.Errorf("MinVersion = %x", cfg.MinVersion)
	}
	pool := x509.NewCertPool()
	pool.AddCert(cert)

	t.Run("https", func(t *testing.T) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		srv := &http.Server{
			Handler: mustKeys(t, goodKey).HTTP(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				io.WriteString(w, r.Proto)
			}), "/healthz"),
			TLSConfig: cfg,
			ErrorLog:  log.New(io.Discard, "", 0),
		}
		go func() { _ = srv.ServeTLS(ln, "", "") }()
		defer srv.Close()
		url := "https://" + ln.Addr().String()
		client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
		resp, err := client.Get(url + "/healthz")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 || resp.TLS == nil {
			t.Errorf("status %d, TLS %v", resp.StatusCode, resp.TLS != nil)
		}
		old := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MaxVersion: tls.VersionTLS11}}}
		if resp, err := old.Get(url + "/healthz"); err == nil {
			resp.Body.Close()
			t.Error("TLS 1.1 handshake succeeded")
		}
	})

	t.Run("grpc", func(t *testing.T) {
		addr := startGRPC(t, mustKeys(t, goodKey), grpc.Creds(credentials.NewTLS(cfg)))
		tc := testpb.NewTestServiceClient(dial(t, addr, credentials.NewTLS(&tls.Config{RootCAs: pool})))
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+goodKey)
		if _, err := tc.EmptyCall(ctx, &testpb.Empty{}); err != nil {
			t.Fatalf("grpc over TLS: %v", err)
		}
	})

	t.Run("reload", func(t *testing.T) {
		c1, err := cfg.GetCertificate(nil)
		if err != nil {
			t.Fatal(err)
		}
		// A renewed pair at the same paths is served once the files change.
		newCert, newKey, _ := selfSigned(t, t.TempDir(), "server")
		for _, p := range [][2]string{{newCert, certFile}, {newKey, keyFile}} {
			data, _ := os.ReadFile(p[0])
			if err := os.WriteFile(p[1], data, 0o600); err != nil {
				t.Fatal(err)
			}
			future := time.Now().Add(time.Minute)
			_ = os.Chtimes(p[1], future, future)
		}
		deadline := time.Now().Add(5 * time.Second)
		for {
			c2, err := cfg.GetCertificate(nil)
			if err != nil {
				t.Fatal(err)
			}
			if string(c2.Certificate[0]) != string(c1.Certificate[0]) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("renewed certificate not picked up")
			}
			time.Sleep(100 * time.Millisecond)
		}
	})

	t.Run("errors", func(t *testing.T) {
		for _, args := range [][2]string{{"", ""}, {certFile, ""}, {"", keyFile}, {filepath.Join(dir, "missing"), keyFile}, {keyFile, certFile}} {
			if _, err := TLSConfig(args[0], args[1]); err == nil {
				t.Errorf("TLSConfig(%q, %q): no error", args[0], args[1])
			}
		}
	})
}

// TestGRPCTapHandle: with the tap handle a call without a key is refused
// as its headers arrive, before any interceptor (and, for a unary call,
// before its message is read); a client holds at most its share of
// health and reflection streams.
func TestGRPCTapHandle(t *testing.T) {
	if mustKeys(t).TapHandle(0) != nil {
		t.Error("TapHandle without keys or a share is not nil")
	}
	var intercepted atomic.Int64
	count := grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		intercepted.Add(1)
		return h(ctx, req)
	})
	k := mustKeys(t, goodKey)
	const share = 3
	// The interceptors are pass-throughs: only the tap handle checks.
	addr := startGRPC(t, nil, grpc.InTapHandle(k.TapHandle(share)), count)
	cc := dial(t, addr, insecure.NewCredentials())
	tc := testpb.NewTestServiceClient(cc)
	hc := healthpb.NewHealthClient(cc)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	keyed := metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+goodKey)

	for _, auth := range []string{"", "Bearer nope"} {
		c := ctx
		if auth != "" {
			c = metadata.AppendToOutgoingContext(ctx, "authorization", auth)
		}
		if _, err := tc.EmptyCall(c, &testpb.Empty{}); status.Code(err) != codes.Unauthenticated {
			t.Errorf("authorization %q: %v, want Unauthenticated", auth, err)
		}
	}
	if n := intercepted.Load(); n != 0 {
		t.Fatalf("%d refused calls reached the interceptors", n)
	}
	if _, err := tc.EmptyCall(keyed, &testpb.Empty{}); err != nil {
		t.Fatalf("with the key: %v", err)
	}

	// The share of exempt streams: Watch streams held open, then Check.
	var cancels []context.CancelFunc
	for i := range share {
		wctx, wcancel := context.WithCancel(ctx)
		cancels = append(cancels, wcancel)
		w, err := hc.Watch(wctx, &healthpb.HealthCheckRequest{})
		if err == nil {
			_, err = w.Recv()
		}
		if err != nil {
			t.Fatalf("watch %d within the share: %v", i, err)
		}
	}
	if _, err := hc.Check(ctx, &healthpb.HealthCheckRequest{}); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("check past the share: %v, want ResourceExhausted", err)
	}
	// Calls that need a key are not counted in the share.
	if _, err := tc.EmptyCall(keyed, &testpb.Empty{}); err != nil {
		t.Fatalf("keyed call beside a full share: %v", err)
	}
	cancels[0]()
	testwait.For(t, 10*time.Second, 10*time.Millisecond, func() error {
		_, err := hc.Check(ctx, &healthpb.HealthCheckRequest{})
		return err
	})
	for _, c := range cancels[1:] {
		c()
	}
}
