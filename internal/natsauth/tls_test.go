package natsauth

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"flag"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/switchyard-ai/switchyard/internal/natstest"
)

func writeSelfSigned(t *testing.T, dir string) (certFile, keyFile string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "nats"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		IPAddresses:           []net.IP{net.IPv4(127, 0, 0, 1)},
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600); err != nil {
		t.Fatal(err)
	}
	return certFile, keyFile
}

// TestClientTLS connects with --nats-tls-ca and a mutual-TLS client
// certificate to a server that verifies it, and fails without the CA.
func TestClientTLS(t *testing.T) {
	certFile, keyFile := writeSelfSigned(t, t.TempDir())
	opts := natstest.DefaultOptions(t)
	tc, err := server.GenTLSConfig(&server.TLSConfigOpts{CertFile: certFile, KeyFile: keyFile, CaFile: certFile, Verify: true})
	if err != nil {
		t.Fatal(err)
	}
	opts.TLSConfig, opts.TLSVerify, opts.TLS = tc, true, true
	s := natstest.RunServer(t, opts)
	url := strings.Replace(s.ClientURL(), "nats://", "tls://", 1)

	connect := func(args ...string) error {
		fs := flag.NewFlagSet("t", flag.ContinueOnError)
		f := RegisterClientFlags(fs)
		if err := fs.Parse(args); err != nil {
			t.Fatal(err)
		}
		o, err := f.Options()
		if err != nil {
			t.Fatal(err)
		}
		nc, err := nats.Connect(url, append(o, nats.MaxReconnects(0))...)
		if err == nil {
			nc.Close()
		}
		return err
	}
	if err := connect("--nats-tls-ca", certFile, "--nats-tls-cert", certFile, "--nats-tls-key", keyFile); err != nil {
		t.Fatalf("mutual TLS: %v", err)
	}
	if err := connect("--nats-tls-ca", certFile); err == nil {
		t.Error("connected without the client certificate the server requires")
	}
	if err := connect(); err == nil {
		t.Error("connected without TLS")
	}
}
