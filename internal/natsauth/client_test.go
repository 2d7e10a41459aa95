package natsauth

import (
	"errors"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestClientFlagsOptions(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	creds := write("user.creds", "-----BEGIN NATS USER JWT-----\neyJ0eXAi\n------END NATS USER JWT------\n")
	notCreds := write("plain.txt", "hello\n")
	empty := write("empty", "\n")
	missing := filepath.Join(dir, "missing.pem")

	tests := []struct {
		name    string
		args    []string
		wantErr string // "" = valid
		n       int    // options returned when valid
	}{
		{name: "none", args: nil},
		{name: "user password", args: []string{"--nats-user", "agent-regular", "--nats-password", "pw"}, n: 2}, // UserInfo + inbox prefix
		{name: "user with explicit prefix", args: []string{"--nats-user", "u", "--nats-password", "pw", "--nats-inbox-prefix", "_INBOX.x"}, n: 2},
		{name: "user with dot keeps default inbox", args: []string{"--nats-user", "a.b", "--nats-password", "pw"}, n: 1},
		{name: "token", args: []string{"--nats-token", "t"}, n: 1},
		{name: "creds", args: []string{"--nats-creds", creds}, n: 1},
		{name: "creds and user", args: []string{"--nats-creds", creds, "--nats-user", "u", "--nats-password", "p"}, wantErr: "use one of"},
		{name: "token and user", args: []string{"--nats-token", "t", "--nats-user", "u", "--nats-password", "p"}, wantErr: "use one of"},
		{name: "password without user", args: []string{"--nats-password", "p"}, wantErr: "needs --nats-user"},
		{name: "user without password", args: []string{"--nats-user", "u"}, wantErr: "needs --nats-password"},
		{name: "creds unreadable", args: []string{"--nats-creds", missing}, wantErr: "--nats-creds"},
		{name: "creds not a creds file", args: []string{"--nats-creds", notCreds}, wantErr: "not a NATS user credentials file"},
		{name: "nkey unreadable", args: []string{"--nats-nkey", missing}, wantErr: "--nats-nkey"},
		{name: "nkey empty", args: []string{"--nats-nkey", empty}, wantErr: "empty file"},
		{name: "nkey not a seed", args: []string{"--nats-nkey", notCreds}, wantErr: "--nats-nkey"},
		{name: "cert without key", args: []string{"--nats-tls-cert", notCreds}, wantErr: "needs --nats-tls-key"},
		{name: "key without cert", args: []string{"--nats-tls-key", notCreds}, wantErr: "needs --nats-tls-cert"},
		{name: "ca unreadable", args: []string{"--nats-tls-ca", missing}, wantErr: "--nats-tls-ca"},
		{name: "ca not PEM", args: []string{"--nats-tls-ca", notCreds}, wantErr: "no PEM certificate"},
		{name: "cert pair invalid", args: []string{"--nats-tls-cert", notCreds, "--nats-tls-key", notCreds}, wantErr: "--nats-tls-cert"},
		{name: "bad inbox prefix", args: []string{"--nats-inbox-prefix", "_INBOX.>"}, wantErr: "--nats-inbox-prefix"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fs := flag.NewFlagSet("t", flag.ContinueOnError)
			f := RegisterClientFlags(fs)
			if err := fs.Parse(tt.args); err != nil {
				t.Fatal(err)
			}
			opts, err := f.Options()
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("Options: %v", err)
				}
				if len(opts) != tt.n {
					t.Fatalf("got %d options, want %d", len(opts), tt.n)
				}
				return
			}
			if err == nil {
				t.Fatalf("Options: no error, want %q", tt.wantErr)
			}
			if !errors.Is(err, ErrBadFlags) || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("Options: %v, want ErrBadFlags with %q", err, tt.wantErr)
			}
		})
	}
}

func TestServerOptionsErrors(t *testing.T) {
	if _, err := ServerOptions(""); err == nil {
		t.Error("empty path: no error")
	}
	if _, err := ServerOptions(filepath.Join(t.TempDir(), "missing.conf")); err == nil {
		t.Error("missing file: no error")
	}
	// The shipped file refuses to load when a password variable is unset,
	// rather than creating a user with an empty password.
	for _, p := range testPasswords {
		t.Setenv(p.env, "")
		os.Unsetenv(p.env)
	}
	if _, err := ServerOptions(shippedConfig); err == nil {
		t.Error("shipped config loaded without its password variables")
	}
}
