package auth

import (
	"crypto/tls"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"
)

// TLSConfig returns the server TLS configuration of the HTTP and gRPC
// ingress: TLS 1.2 or later, the certificate and key from PEM files. The
// files are checked now and read again when they change (checked at most
// once a second), so a renewed certificate is served without a restart.
//
// Use it as http.Server.TLSConfig with ServeTLS(ln, "", "") (which adds h2
// and http/1.1 to NextProtos) and as grpc.Creds(credentials.NewTLS(cfg)).
func TLSConfig(certFile, keyFile string) (*tls.Config, error) {
	switch {
	case certFile == "" && keyFile == "":
		return nil, errors.New("auth: TLS needs a certificate and a key file")
	case certFile == "":
		return nil, fmt.Errorf("auth: TLS key %s without a certificate file", keyFile)
	case keyFile == "":
		return nil, fmt.Errorf("auth: TLS certificate %s without a key file", certFile)
	}
	r := &certReloader{certFile: certFile, keyFile: keyFile}
	if err := r.load(); err != nil {
		return nil, err
	}
	return &tls.Config{
		MinVersion:     tls.VersionTLS12,
		GetCertificate: r.get,
	}, nil
}

type certReloader struct {
	certFile, keyFile string

	mu        sync.Mutex // guards the fields below
	cert      *tls.Certificate
	certMod   time.Time
	keyMod    time.Time
	lastCheck time.Time
}

func (r *certReloader) load() error {
	cs, err := os.Stat(r.certFile)
	if err != nil {
		return fmt.Errorf("auth: TLS certificate: %w", err)
	}
	ks, err := os.Stat(r.keyFile)
	if err != nil {
		return fmt.Errorf("auth: TLS key: %w", err)
	}
	cert, err := tls.LoadX509KeyPair(r.certFile, r.keyFile)
	if err != nil {
		return fmt.Errorf("auth: TLS certificate %s, key %s: %w", r.certFile, r.keyFile, err)
	}
	r.mu.Lock()
	r.cert, r.certMod, r.keyMod, r.lastCheck = &cert, cs.ModTime(), ks.ModTime(), time.Now()
	r.mu.Unlock()
	return nil
}

func (r *certReloader) get(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	r.mu.Lock()
	cert := r.cert
	stale := time.Since(r.lastCheck) >= time.Second
	if stale {
		r.lastCheck = time.Now()
	}
	certMod, keyMod := r.certMod, r.keyMod
	r.mu.Unlock()
	if !stale {
		return cert, nil
	}
	cs, err1 := os.Stat(r.certFile)
	ks, err2 := os.Stat(r.keyFile)
	if err1 != nil || err2 != nil || (cs.ModTime().Equal(certMod) && ks.ModTime().Equal(keyMod)) {
		return cert, nil
	}
	// A half-written renewal fails to load; keep serving the old pair.
	if err := r.load(); err != nil {
		return cert, nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.cert, nil
}
