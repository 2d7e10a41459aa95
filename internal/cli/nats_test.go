package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/switchyard-ai/switchyard/internal/natstest"
	"github.com/switchyard-ai/switchyard/internal/testwait"
)

func jsonLogger(t *testing.T) (*testwait.Buffer, *NATSLink) {
	t.Helper()
	buf := &testwait.Buffer{}
	log, err := Logger(buf, "json", "info")
	if err != nil {
		t.Fatal(err)
	}
	return buf, NewNATSLink(log, "test-conn")
}

// linesWith returns the JSON log lines whose message contains s.
func linesWith(t *testing.T, log, s string) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(log), "\n") {
		if line == "" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("log line is not JSON: %q", line)
		}
		if msg, _ := m["msg"].(string); strings.Contains(msg, s) {
			out = append(out, m)
		}
	}
	return out
}

// TestNATSLinkPermissionViolationLogsOnce: a denied publish, repeated,
// is one structured log line through the logger (not a raw line on
// stderr, nats.go's default), naming the subject the server refused.
func TestNATSLinkPermissionViolationLogsOnce(t *testing.T) {
	opts := natstest.DefaultOptions(t)
	opts.Users = []*server.User{{
		Username: "u", Password: "p",
		Permissions: &server.Permissions{Publish: &server.SubjectPermission{Deny: []string{"denied.>"}}},
	}}
	s := natstest.RunServer(t, opts)
	buf, link := jsonLogger(t)
	nc, err := nats.Connect(s.ClientURL(), append(link.Options(), nats.UserInfo("u", "p"))...)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	for range 5 {
		if err := nc.Publish("denied.x", []byte("x")); err != nil {
			t.Fatal(err)
		}
		if err := nc.Flush(); err != nil {
			t.Fatal(err)
		}
	}
	testwait.For(t, 5*time.Second, 10*time.Millisecond, func() error {
		if len(linesWith(t, buf.String(), "permission violation")) == 0 {
			return errors.New("no permission violation logged yet")
		}
		return nil
	})
	// The server answers each publish; give the rest time to arrive.
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	lines := linesWith(t, buf.String(), "permission violation")
	if len(lines) != 1 {
		t.Fatalf("%d permission violation lines, want 1:\n%s", len(lines), buf.String())
	}
	if lvl := lines[0]["level"]; lvl != "ERROR" {
		t.Errorf("level %v, want ERROR", lvl)
	}
	if e, _ := lines[0]["err"].(string); !strings.Contains(e, "denied.x") {
		t.Errorf("err %q does not name the subject", e)
	}
}

// TestNATSLinkNamesAuthFailureAndRecovers: a refused password is named in
// the server's words, and the connection keeps dialling, so the same
// client connects once the server accepts it (nats.go's default is to
// close a connection refused twice with the same error).
func TestNATSLinkNamesAuthFailureAndRecovers(t *testing.T) {
	opts := natstest.DefaultOptions(t)
	opts.Username, opts.Password = "u", "right"
	s := natstest.RunServer(t, opts)
	buf, link := jsonLogger(t)
	creds := []nats.Option{nats.UserInfo("u", "wrong")}
	dials := &countingDialer{}
	nc, err := nats.Connect(s.ClientURL(), append(link.Options(), append(creds, nats.SetCustomDialer(dials))...)...)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go link.Watch(ctx, nc, s.ClientURL(), creds)

	testwait.For(t, 10*time.Second, 10*time.Millisecond, func() error {
		err := link.Err(nc)
		if err == nil || !strings.Contains(strings.ToLower(err.Error()), "authorization violation") {
			return errors.New("auth failure not named yet: " + errString(err))
		}
		return nil
	})
	if n := len(linesWith(t, buf.String(), "NATS connection failing")); n != 1 {
		t.Fatalf("%d failure lines, want 1 (a repeated failure logs once):\n%s", n, buf.String())
	}

	// Fix the server: it accepts the client's password now.
	fixed := opts.Clone()
	fixed.Password = "wrong"
	if err := s.ReloadOptions(fixed); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, 20*time.Second, 20*time.Millisecond, func() error {
		if !nc.IsConnected() {
			return errors.New("not reconnected: " + errString(link.Err(nc)))
		}
		return nil
	})
	if err := link.Err(nc); err != nil {
		t.Fatalf("connected, yet Err = %v", err)
	}

	// The server stops accepting the password of a connected client: the
	// server drops it, and each reconnect is refused the same way. The
	// connection must stay open, dialling, until the password works again.
	if err := s.ReloadOptions(opts.Clone()); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, 10*time.Second, 10*time.Millisecond, func() error {
		err := link.Err(nc)
		if err == nil || !strings.Contains(strings.ToLower(err.Error()), "authorization violation") {
			return errors.New("auth failure not named yet: " + errString(err))
		}
		return nil
	})
	// nats.go gives up by default after the second refusal: several more
	// dials show the connection still trying.
	from := dials.n.Load()
	testwait.For(t, 20*time.Second, 10*time.Millisecond, func() error {
		if nc.IsClosed() {
			t.Fatal("connection closed after refused reconnects")
		}
		if n := dials.n.Load() - from; n < 4 {
			return fmt.Errorf("%d dials since the refusal began", n)
		}
		return nil
	})
	if err := s.ReloadOptions(fixed); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, 20*time.Second, 20*time.Millisecond, func() error {
		if !nc.IsConnected() {
			return errors.New("not reconnected: " + errString(link.Err(nc)))
		}
		return nil
	})
}

// countingDialer counts the connection's dials: each reconnect attempt
// is one.
type countingDialer struct {
	n atomic.Int64
	d net.Dialer
}

func (c *countingDialer) Dial(network, address string) (net.Conn, error) {
	c.n.Add(1)
	return c.d.Dial(network, address)
}

func errString(err error) string {
	if err == nil {
		return "<nil>"
	}
	return err.Error()
}

func TestReconnectDelayBacksOff(t *testing.T) {
	prev := time.Duration(0)
	for i := 1; i < 12; i++ {
		d := reconnectDelay(i)
		if d < prev || d > 4*time.Second || d <= 0 {
			t.Fatalf("attempt %d: delay %s after %s", i, d, prev)
		}
		prev = d
	}
	if reconnectDelay(1) != 250*time.Millisecond || reconnectDelay(20) != 4*time.Second {
		t.Fatalf("delays %s .. %s, want 250ms .. 4s", reconnectDelay(1), reconnectDelay(20))
	}
}

func TestRedact(t *testing.T) {
	got := redact("nats://u:secret@a:4222, tls://b:4222")
	if strings.Contains(got, "secret") || !strings.Contains(got, "a:4222") || !strings.Contains(got, "tls://b:4222") {
		t.Fatalf("redact = %q", got)
	}
}
