package auth

import (
	"net"
	"net/netip"
	"sync"
)

// ConnLimiter bounds the client connections open at once over every
// listener it wraps (the broker's HTTP and gRPC listeners share one), in
// total and per client. A client is an IPv4 address or an IPv6 /64 (one
// host can take a whole /64 at no cost). A connection past either bound is
// refused as it is accepted, before TLS, a request head or a key is read,
// so that one client holding many silent connections leaves the others'
// share, and a health probe's, free.
//
// Behind a proxy that pools every client's connections into a few of its
// own, the per-client share counts the proxy: give it a share as large as
// the total (or none).
type ConnLimiter struct {
	max       int // 0: no total bound
	perClient int // 0: no per-client bound

	mu       sync.Mutex
	open     int
	byClient map[netip.Prefix]int
}

// Refusal says which bound refused a connection.
type Refusal int

const (
	// RefusedTotal: every connection the limiter allows is open.
	RefusedTotal Refusal = iota + 1
	// RefusedClient: the client holds its whole share.
	RefusedClient
)

// NewConnLimiter returns a limiter of max connections in total and
// perClient per client; 0 leaves that bound off.
func NewConnLimiter(max, perClient int) *ConnLimiter {
	return &ConnLimiter{max: max, perClient: perClient, byClient: map[netip.Prefix]int{}}
}

// Open is the number of connections open through the limiter.
func (l *ConnLimiter) Open() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.open
}

// ClientKey is the client a remote address counts against: its IPv4
// address, or the /64 of its IPv6 address. An address that is not IP
// (a Unix socket, a test pipe) is one client of its own, the zero prefix.
func ClientKey(addr net.Addr) netip.Prefix {
	var ip netip.Addr
	switch a := addr.(type) {
	case *net.TCPAddr:
		ip, _ = netip.AddrFromSlice(a.IP)
	case *net.UDPAddr:
		ip, _ = netip.AddrFromSlice(a.IP)
	default:
		if addr != nil {
			if ap, err := netip.ParseAddrPort(addr.String()); err == nil {
				ip = ap.Addr()
			}
		}
	}
	ip = ip.Unmap()
	switch {
	case ip.Is4():
		return netip.PrefixFrom(ip, 32)
	case ip.Is6():
		p, _ := ip.Prefix(64)
		return p
	}
	return netip.Prefix{}
}

// acquire takes a slot for a connection from remote.
func (l *ConnLimiter) acquire(remote net.Addr) (netip.Prefix, Refusal) {
	key := ClientKey(remote)
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.max > 0 && l.open >= l.max {
		return key, RefusedTotal
	}
	if l.perClient > 0 && l.byClient[key] >= l.perClient {
		return key, RefusedClient
	}
	l.open++
	l.byClient[key]++
	return key, 0
}

func (l *ConnLimiter) release(key netip.Prefix) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.open--
	if n := l.byClient[key] - 1; n > 0 {
		l.byClient[key] = n
	} else {
		delete(l.byClient, key)
	}
}

// maxRefusing bounds the goroutines that answer refused connections on one
// listener; past it refused connections are closed without an answer.
const maxRefusing = 64

// Listener wraps ln: each connection it accepts takes a slot, given back
// when the connection is closed. A connection past a bound goes to refuse
// (nil: it is closed), which runs in its own goroutine, at most
// maxRefusing at once, and must close it.
func (l *ConnLimiter) Listener(ln net.Listener, refuse func(net.Conn, Refusal)) net.Listener {
	return &limitListener{Listener: ln, l: l, refuse: refuse, refusing: make(chan struct{}, maxRefusing)}
}

type limitListener struct {
	net.Listener
	l        *ConnLimiter
	refuse   func(net.Conn, Refusal)
	refusing chan struct{}
}

func (ll *limitListener) Accept() (net.Conn, error) {
	for {
		c, err := ll.Listener.Accept()
		if err != nil {
			return nil, err
		}
		key, why := ll.l.acquire(c.RemoteAddr())
		if why == 0 {
			return &limitConn{Conn: c, l: ll.l, key: key}, nil
		}
		if ll.refuse == nil {
			_ = c.Close()
			continue
		}
		select {
		case ll.refusing <- struct{}{}:
			go func() {
				defer func() { <-ll.refusing }()
				ll.refuse(c, why)
			}()
		default:
			_ = c.Close()
		}
	}
}

// limitConn gives its slot back once, when closed.
type limitConn struct {
	net.Conn
	l    *ConnLimiter
	key  netip.Prefix
	once sync.Once
}

func (c *limitConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { c.l.release(c.key) })
	return err
}

// CloseWrite half-closes the connection underneath when it can (net/http
// does so before closing a connection whose answer the client must read).
func (c *limitConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

// NetConn returns the connection underneath, as tls.Conn's does.
func (c *limitConn) NetConn() net.Conn { return c.Conn }
