package natsauth

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"

	"github.com/nats-io/nats.go"
)

// ErrBadFlags is wrapped by every error of ClientFlags.Options about a
// combination of flags or an unusable file.
var ErrBadFlags = errors.New("natsauth: bad NATS client flags")

// ClientFlags are the NATS client security flags of a command. Secrets are
// better given through the environment (SWITCHYARD_NATS_PASSWORD,
// SWITCHYARD_NATS_TOKEN) or files than on the command line, where ps shows
// them.
type ClientFlags struct {
	Creds       string // JWT user credentials file (--nats-creds)
	NKey        string // nkey seed file (--nats-nkey)
	User        string // --nats-user
	Password    string // --nats-password
	Token       string // --nats-token
	TLSCA       string // CA bundle that signs the server's certificate (--nats-tls-ca)
	TLSCert     string // client certificate for mutual TLS (--nats-tls-cert)
	TLSKey      string // its private key (--nats-tls-key)
	InboxPrefix string // --nats-inbox-prefix; default _INBOX.<user> with --nats-user
}

// RegisterClientFlags registers the flags on fs and returns where they land.
func RegisterClientFlags(fs *flag.FlagSet) *ClientFlags {
	f := &ClientFlags{}
	fs.StringVar(&f.Creds, "nats-creds", "", "NATS: JWT user credentials file (.creds)")
	fs.StringVar(&f.NKey, "nats-nkey", "", "NATS: nkey seed file")
	fs.StringVar(&f.User, "nats-user", "", "NATS: user name (with --nats-password)")
	fs.StringVar(&f.Password, "nats-password", "", "NATS: password (prefer the environment variable SWITCHYARD_NATS_PASSWORD)")
	fs.StringVar(&f.Token, "nats-token", "", "NATS: authentication token (prefer SWITCHYARD_NATS_TOKEN)")
	fs.StringVar(&f.TLSCA, "nats-tls-ca", "", "NATS: CA certificates (PEM) that sign the server's certificate; enables TLS")
	fs.StringVar(&f.TLSCert, "nats-tls-cert", "", "NATS: client certificate (PEM) for mutual TLS; enables TLS")
	fs.StringVar(&f.TLSKey, "nats-tls-key", "", "NATS: client certificate's private key (PEM)")
	fs.StringVar(&f.InboxPrefix, "nats-inbox-prefix", "", "NATS: prefix of reply inboxes (default _INBOX.<nats-user> when --nats-user is set, else _INBOX), so permissions can give each user only its own inboxes")
	return f
}

// Options validates the flags and returns the nats.go options they mean.
// With no flag set it returns no options: an unauthenticated plain-text
// connection, as before.
func (f *ClientFlags) Options() ([]nats.Option, error) {
	if f == nil {
		return nil, nil
	}
	var opts []nats.Option
	methods := 0
	for _, set := range []bool{f.Creds != "", f.NKey != "", f.User != "", f.Token != ""} {
		if set {
			methods++
		}
	}
	if methods > 1 {
		return nil, fmt.Errorf("%w: use one of --nats-creds, --nats-nkey, --nats-user/--nats-password and --nats-token", ErrBadFlags)
	}
	switch {
	case f.Password != "" && f.User == "":
		return nil, fmt.Errorf("%w: --nats-password needs --nats-user", ErrBadFlags)
	case f.User != "" && f.Password == "":
		return nil, fmt.Errorf("%w: --nats-user needs --nats-password (or SWITCHYARD_NATS_PASSWORD)", ErrBadFlags)
	}

	switch {
	case f.Creds != "":
		data, err := readFile("--nats-creds", f.Creds)
		if err != nil {
			return nil, err
		}
		if !bytes.Contains(data, []byte("BEGIN NATS USER JWT")) {
			return nil, fmt.Errorf("%w: --nats-creds %s: not a NATS user credentials file (no user JWT)", ErrBadFlags, f.Creds)
		}
		opts = append(opts, nats.UserCredentials(f.Creds))
	case f.NKey != "":
		if _, err := readFile("--nats-nkey", f.NKey); err != nil {
			return nil, err
		}
		o, err := nats.NkeyOptionFromSeed(f.NKey)
		if err != nil {
			return nil, fmt.Errorf("%w: --nats-nkey %s: %w", ErrBadFlags, f.NKey, err)
		}
		opts = append(opts, o)
	case f.User != "":
		opts = append(opts, nats.UserInfo(f.User, f.Password))
	case f.Token != "":
		opts = append(opts, nats.Token(f.Token))
	}

	tlsOpts, err := f.tlsOptions()
	if err != nil {
		return nil, err
	}
	opts = append(opts, tlsOpts...)

	prefix := f.InboxPrefix
	if prefix == "" && f.User != "" && inboxToken(f.User) {
		prefix = "_INBOX." + f.User
	}
	if prefix != "" {
		if strings.ContainsAny(prefix, "*> \t\r\n") || strings.HasSuffix(prefix, ".") || strings.HasPrefix(prefix, ".") || strings.Contains(prefix, "..") {
			return nil, fmt.Errorf("%w: --nats-inbox-prefix %q: want tokens without wildcards, spaces or empty tokens", ErrBadFlags, prefix)
		}
		opts = append(opts, nats.CustomInboxPrefix(prefix))
	}
	return opts, nil
}

// inboxToken reports whether a user name can be one token of an inbox.
func inboxToken(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c <= ' ' || c == '.' || c == '*' || c == '>' || c >= 0x7f {
			return false
		}
	}
	return s != ""
}

func (f *ClientFlags) tlsOptions() ([]nats.Option, error) {
	switch {
	case f.TLSCert != "" && f.TLSKey == "":
		return nil, fmt.Errorf("%w: --nats-tls-cert needs --nats-tls-key", ErrBadFlags)
	case f.TLSKey != "" && f.TLSCert == "":
		return nil, fmt.Errorf("%w: --nats-tls-key needs --nats-tls-cert", ErrBadFlags)
	}
	if f.TLSCA == "" && f.TLSCert == "" {
		return nil, nil
	}
	// The files are checked now for a clear error at start; nats.go reads
	// them again on every (re)connect, so rotated certificates are picked up.
	opts := []nats.Option{nats.Secure(&tls.Config{MinVersion: tls.VersionTLS12})}
	if f.TLSCA != "" {
		pem, err := readFile("--nats-tls-ca", f.TLSCA)
		if err != nil {
			return nil, err
		}
		if !x509.NewCertPool().AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("%w: --nats-tls-ca %s: no PEM certificate in it", ErrBadFlags, f.TLSCA)
		}
		opts = append(opts, nats.RootCAs(f.TLSCA))
	}
	if f.TLSCert != "" {
		if _, err := tls.LoadX509KeyPair(f.TLSCert, f.TLSKey); err != nil {
			return nil, fmt.Errorf("%w: --nats-tls-cert %s / --nats-tls-key %s: %w", ErrBadFlags, f.TLSCert, f.TLSKey, err)
		}
		opts = append(opts, nats.ClientCert(f.TLSCert, f.TLSKey))
	}
	return opts, nil
}

func readFile(flagName, path string) ([]byte, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrBadFlags, flagName, err)
	}
	if len(bytes.TrimSpace(data)) == 0 {
		return nil, fmt.Errorf("%w: %s %s: empty file", ErrBadFlags, flagName, path)
	}
	return data, nil
}
