package auth

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/switchyard-ai/switchyard/internal/testwait"
)

func TestClientKey(t *testing.T) {
	tests := []struct {
		name string
		addr net.Addr
		want string
	}{
		{"ipv4", &net.TCPAddr{IP: net.IPv4(192, 0, 2, 7), Port: 1}, "192.0.2.7/32"},
		{"ipv4-mapped ipv6 is ipv4", &net.TCPAddr{IP: net.ParseIP("::ffff:192.0.2.7"), Port: 1}, "192.0.2.7/32"},
		{"ipv6 by /64", &net.TCPAddr{IP: net.ParseIP("2001:db8:1:2:aaaa::1"), Port: 1}, "2001:db8:1:2::/64"},
		{"same /64, other host", &net.TCPAddr{IP: net.ParseIP("2001:db8:1:2:ffff::9"), Port: 2}, "2001:db8:1:2::/64"},
		{"not ip", &net.UnixAddr{Name: "/tmp/x", Net: "unix"}, "invalid Prefix"},
		{"nil", nil, "invalid Prefix"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := ClientKey(tt.addr).String(); got != tt.want {
				t.Errorf("ClientKey(%v) = %s, want %s", tt.addr, got, tt.want)
			}
		})
	}
}

// dialFrom connects to ln from the loopback address src, or skips the test
// where the host has no such address.
func dialFrom(t *testing.T, ln net.Listener, src string) net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: 5 * time.Second}
	c, err := d.Dial("tcp", ln.Addr().String())
	if err != nil {
		if src != "127.0.0.1" {
			t.Skipf("no loopback address %s here: %v", src, err)
		}
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	return c
}

// limitServer serves ln through l: each accepted connection is held open
// until its client closes it; refused ones get their Refusal's number and
// are closed.
func limitServer(t *testing.T, l *ConnLimiter) net.Listener {
	t.Helper()
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln := l.Listener(raw, func(c net.Conn, why Refusal) {
		fmt.Fprintf(c, "refused %d\n", why)
		c.Close()
	})
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_, _ = io.WriteString(c, "ok\n")
				_, _ = io.Copy(io.Discard, c)
			}()
		}
	}()
	return ln
}

// greet reads the server's first line on c.
func greet(t *testing.T, c net.Conn) string {
	t.Helper()
	buf := make([]byte, 16)
	n, err := io.ReadAtLeast(c, buf, 3)
	if err != nil {
		t.Fatalf("no greeting: %v", err)
	}
	return string(buf[:n])
}

// TestConnLimiter: a client past its share is refused while another
// client is still served; past the total everyone is; a closed connection
// gives its slot back.
func TestConnLimiter(t *testing.T) {
	l := NewConnLimiter(5, 2)
	ln := limitServer(t, l)
	refusedClient := fmt.Sprintf("refused %d\n", RefusedClient)
	refusedTotal := fmt.Sprintf("refused %d\n", RefusedTotal)

	a1, a2 := dialFrom(t, ln, "127.0.0.2"), dialFrom(t, ln, "127.0.0.2")
	for _, c := range []net.Conn{a1, a2} {
		if got := greet(t, c); got != "ok\n" {
			t.Fatalf("greedy client within its share: %q", got)
		}
	}
	if got := greet(t, dialFrom(t, ln, "127.0.0.2")); got != refusedClient {
		t.Fatalf("third connection of one client: %q, want %q", got, refusedClient)
	}
	// Another client still gets its share.
	b1, b2 := dialFrom(t, ln, "127.0.0.1"), dialFrom(t, ln, "127.0.0.1")
	for _, c := range []net.Conn{b1, b2} {
		if got := greet(t, c); got != "ok\n" {
			t.Fatalf("other client beside a greedy one: %q", got)
		}
	}
	if got := greet(t, dialFrom(t, ln, "127.0.0.3")); got != "ok\n" {
		t.Fatalf("third client: %q", got)
	}
	if got := greet(t, dialFrom(t, ln, "127.0.0.4")); got != refusedTotal {
		t.Fatalf("past the total: %q, want %q", got, refusedTotal)
	}
	if n := l.Open(); n != 5 {
		t.Fatalf("Open = %d, want 5", n)
	}
	// A closed connection gives its client's slot back.
	a1.Close()
	testwait.For(t, 10*time.Second, 10*time.Millisecond, func() error {
		if n := l.Open(); n != 4 {
			return fmt.Errorf("open %d after a close, want 4", n)
		}
		return nil
	})
	if got := greet(t, dialFrom(t, ln, "127.0.0.2")); got != "ok\n" {
		t.Fatalf("after a close: %q", got)
	}
}

// TestConnLimiterSharedListeners: connections to two listeners count
// against one share.
func TestConnLimiterSharedListeners(t *testing.T) {
	l := NewConnLimiter(0, 2)
	one, two := limitServer(t, l), limitServer(t, l)
	greet(t, dialFrom(t, one, "127.0.0.1"))
	greet(t, dialFrom(t, two, "127.0.0.1"))
	if got := greet(t, dialFrom(t, two, "127.0.0.1")); got != fmt.Sprintf("refused %d\n", RefusedClient) {
		t.Fatalf("third connection over two listeners: %q", got)
	}
}

// TestConnLimiterRefuseNil: without a refuse function a refused
// connection is closed at once.
func TestConnLimiterRefuseNil(t *testing.T) {
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln := NewConnLimiter(1, 0).Listener(raw, nil)
	t.Cleanup(func() { ln.Close() })
	accepted := make(chan net.Conn, 4)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted <- c
		}
	}()
	dialFrom(t, ln, "127.0.0.1")
	held := <-accepted
	t.Cleanup(func() { held.Close() })
	c := dialFrom(t, ln, "127.0.0.1")
	_, err = c.Read(make([]byte, 1))
	var ne net.Error
	if err == nil || (errors.As(err, &ne) && ne.Timeout()) {
		t.Fatalf("refused connection still open: %v", err)
	}
	if n := len(accepted); n != 0 {
		t.Fatalf("%d connections accepted past the bound", n)
	}
}

func TestConnLimiterZeroIsOff(t *testing.T) {
	l := NewConnLimiter(0, 0)
	for i := range 100 {
		if _, why := l.acquire(&net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: i}); why != 0 {
			t.Fatalf("connection %d refused (%d) with no bounds", i, why)
		}
	}
	l.release(netip.MustParsePrefix("127.0.0.1/32"))
	if n := l.Open(); n != 99 {
		t.Fatalf("Open = %d, want 99", n)
	}
}
