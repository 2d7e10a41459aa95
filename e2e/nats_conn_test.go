package e2e

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/switchyard-ai/switchyard/internal/agentcmd"
	"github.com/switchyard-ai/switchyard/internal/brokercmd"
	"github.com/switchyard-ai/switchyard/internal/cmdtest"
	"github.com/switchyard-ai/switchyard/internal/testwait"
)

// natsConf is a nats-server configuration a test rewrites and reloads.
type natsConf struct {
	port     int
	store    string
	user     string // with password: authorization for every client
	password string
	certFile string // with keyFile: TLS required of every client
	keyFile  string
}

func (c natsConf) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "listen: 127.0.0.1:%d\njetstream { store_dir: %q }\n", c.port, c.store)
	if c.user != "" {
		fmt.Fprintf(&b, "authorization { user: %q, password: %q }\n", c.user, c.password)
	}
	if c.certFile != "" {
		fmt.Fprintf(&b, "tls { cert_file: %q, key_file: %q }\n", c.certFile, c.keyFile)
	}
	return b.String()
}

// TestNATSFailuresNamedAndRecovered runs a broker and an agent against a
// real nats-server process that refuses them, checks that both name the
// failure in the server's or the TLS stack's words (log, /readyz, the
// agent's /readyz), then fixes the server with a config reload (or starts
// it, for a wrong port) and checks that the same processes become ready
// and serve, without a restart.
func TestNATSFailuresNamedAndRecovered(t *testing.T) {
	cases := []struct {
		name string
		// bad is the server's config while it refuses the clients (nil:
		// no server at all); good the one it is fixed with.
		bad, good func(c natsConf) *natsConf
		// client flags, beyond --nats-url
		client []string
		want   string // in /readyz and the log, lower case
	}{
		{
			name:   "wrong password",
			bad:    func(c natsConf) *natsConf { c.user, c.password = "sy", "right"; return &c },
			good:   func(c natsConf) *natsConf { c.user, c.password = "sy", "wrong"; return &c },
			client: []string{"--nats-user", "sy", "--nats-password", "wrong"},
			want:   "authorization violation",
		},
		{
			name:   "missing password",
			bad:    func(c natsConf) *natsConf { c.user, c.password = "sy", "right"; return &c },
			good:   func(c natsConf) *natsConf { return &c },
			client: nil,
			want:   "authorization violation",
		},
		{
			// nats:// against a server that requires TLS, with no CA to
			// verify it: nats.go upgrades to TLS and cannot verify.
			name: "tls-only server, no CA",
			bad: func(c natsConf) *natsConf {
				c.certFile, c.keyFile = writeTestCert(t, c.store+"-tls")
				return &c
			},
			good:   func(c natsConf) *natsConf { return &c },
			client: nil,
			want:   "certificate",
		},
		{
			name:   "wrong port",
			bad:    nil,
			good:   func(c natsConf) *natsConf { return &c },
			client: nil,
			want:   "connection refused",
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			base := natsConf{port: freePort(t), store: filepath.Join(dir, "js")}
			confPath := filepath.Join(dir, "nats.conf")
			var srv *child
			if tc.bad != nil {
				writeFile(t, confPath, tc.bad(base).String())
				srv = startChild(t, natsServerBinary(t), "-c", confPath)
			}
			url := fmt.Sprintf("nats://127.0.0.1:%d", base.port)

			b := cmdtest.Start(t, brokercmd.Run, append([]string{"--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0",
				"--nats-url", url, "--heartbeat-interval", "100ms", "--slow-start", "0", "--log-level", "warn"}, tc.client...)...)
			metrics := fmt.Sprintf("127.0.0.1:%d", freePort(t))
			a := cmdtest.Start(t, agentcmd.Run, append([]string{"--nats-url", url, "--engine", "sim", "--model", "sim-model",
				"--id", "agent-1", "--slots", "2", "--heartbeat", liveHeartbeat, "--slow-start", "0",
				"--metrics-listen", metrics, "--log-level", "warn"}, tc.client...)...)
			httpURL, _, _ := cmdtest.WaitListening(t, b.Out, b.Exited)

			// Named within seconds, in every place an operator looks.
			testwait.For(t, 15*time.Second, 20*time.Millisecond, func() error {
				for _, probe := range []struct{ what, url string }{{"broker", httpURL + "/readyz"}, {"agent", "http://" + metrics + "/readyz"}} {
					code, body, err := readyBody(probe.url)
					if err != nil {
						return err
					}
					if code == http.StatusOK || !strings.Contains(strings.ToLower(body), tc.want) {
						return fmt.Errorf("%s /readyz: %d %q, want not 200 naming %q", probe.what, code, body, tc.want)
					}
				}
				for what, log := range map[string]string{"broker": b.Err.String(), "agent": a.Err.String()} {
					if !strings.Contains(strings.ToLower(log), tc.want) {
						return fmt.Errorf("%s log does not name %q yet", what, tc.want)
					}
				}
				return nil
			})
			if code, body, _ := readyBody(httpURL + "/healthz"); code != http.StatusOK {
				t.Fatalf("broker /healthz %d %q: liveness must not depend on NATS", code, body)
			}

			// Fix the server; the same processes come back.
			writeFile(t, confPath, tc.good(base).String())
			if srv == nil {
				srv = startChild(t, natsServerBinary(t), "-c", confPath)
			} else if err := srv.cmd.Process.Signal(syscall.SIGHUP); err != nil {
				t.Fatal(err)
			}
			testwait.Status(t, nil, httpURL+"/readyz", http.StatusOK)
			testwait.Status(t, nil, "http://"+metrics+"/readyz", http.StatusOK)
			cmdtest.WaitEligible(t, httpURL, "agent-1")
			resp, err := http.Post(httpURL+"/v1/chat/completions", "application/json",
				strings.NewReader(`{"model":"sim-model","messages":[{"role":"user","content":"hi"}],"max_tokens":3}`))
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("after the fix: %d %s", resp.StatusCode, body)
			}
		})
	}
}

func readyBody(url string) (int, string, error) {
	c := &http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body), err
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}

// writeTestCert writes a self-signed certificate for 127.0.0.1 that no
// client trusts.
func writeTestCert(t *testing.T, dir string) (certFile, keyFile string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	cert, key := selfSigned(t)
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	writeFile(t, certFile, string(cert))
	writeFile(t, keyFile, string(key))
	return certFile, keyFile
}
