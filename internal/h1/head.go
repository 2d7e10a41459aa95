package h1

import (
	"bytes"
	"net/http"
	"net/textproto"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
)

// head is a request's head as parseHead read it.
type head struct {
	size           int // bytes of the head, its final CRLF included
	method, target string
	header         http.Header
	host           string
	contentLength  int64
	close          bool // Connection: close
	expectContinue bool
}

// parseHead parses a request head that ends in b's first CRLFCRLF. It
// takes only what it is sure of: HTTP/1.1, an origin-form target, CRLF
// line ends, one Host, at most one Content-Length, no Transfer-Encoding
// or Upgrade, no folded line, Expect only as 100-continue. Anything else
// is not ok, and the connection goes to net/http, which takes it or
// answers it as it always did. Header names are canonicalized as
// net/http does.
func parseHead(b []byte, max int) (*head, bool) {
	end := bytes.Index(b, crlfcrlf)
	if end < 0 || end+4 > max {
		return nil, false
	}
	// The head's text is one string; the target and every header value
	// are parts of it, and the values' slices parts of one array: a few
	// allocations per request where there were two per header line.
	all := string(b[:end+2]) // every line with its CRLF
	h := &head{size: end + 4, contentLength: 0}
	i := strings.Index(all, "\r\n")
	line, lines := all[:i], all[i+2:]
	// Request line: method SP target SP HTTP/1.1.
	sp1 := strings.IndexByte(line, ' ')
	if sp1 <= 0 {
		return nil, false
	}
	rest := line[sp1+1:]
	sp2 := strings.IndexByte(rest, ' ')
	if sp2 <= 0 || rest[sp2+1:] != "HTTP/1.1" {
		return nil, false
	}
	method, target := line[:sp1], rest[:sp2]
	if !validToken(method) || target[0] != '/' || !validTarget(target) {
		return nil, false
	}
	h.method = methodString(method)
	h.target = target
	n := strings.Count(lines, "\r\n")
	vals := make([]string, n)
	h.header = make(http.Header, n)
	hosts, lengths := 0, 0
	for k := 0; len(lines) > 0; k++ {
		i := strings.Index(lines, "\r\n")
		line := lines[:i]
		lines = lines[i+2:]
		colon := strings.IndexByte(line, ':')
		if colon <= 0 || !validToken(line[:colon]) {
			return nil, false // a folded line, a bad name: net/http's call
		}
		v := strings.Trim(line[colon+1:], " \t")
		if !validValue(v) {
			return nil, false
		}
		key := canonicalKey(line[:colon])
		if vs, ok := h.header[key]; ok {
			h.header[key] = append(vs, v)
		} else {
			vals[k] = v
			h.header[key] = vals[k : k+1 : k+1]
		}
		switch key {
		case "Host":
			hosts++
			h.host = v
		case "Content-Length":
			lengths++
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil || n < 0 || v[0] == '+' {
				return nil, false
			}
			h.contentLength = n
		case "Transfer-Encoding", "Upgrade":
			return nil, false
		case "Connection":
			for f := range strings.SplitSeq(v, ",") {
				switch f = strings.TrimSpace(f); {
				case strings.EqualFold(f, "close"):
					h.close = true
				case strings.EqualFold(f, "upgrade"):
					return nil, false
				}
			}
		case "Expect":
			if !strings.EqualFold(v, "100-continue") {
				return nil, false
			}
			h.expectContinue = true
		}
	}
	if hosts != 1 || lengths > 1 || !validHost(h.host) {
		return nil, false
	}
	// As net/http: the host is Request.Host, not a header field.
	delete(h.header, "Host")
	return h, true
}

// validHost reports whether a Host value has only the bytes net/http
// allows in one (httpguts.ValidHostHeader).
func validHost(h string) bool {
	for i := 0; i < len(h); i++ {
		c := h[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte("!$%&()*+,-.:;=[]'_~", c) >= 0) {
			return false
		}
	}
	return true
}

var crlf = []byte("\r\n")

// methodString returns the method without allocating for the common ones.
func methodString(m string) string {
	switch m {
	case http.MethodPost:
		return http.MethodPost
	case http.MethodGet:
		return http.MethodGet
	}
	return m
}

// validToken reports whether b is an RFC 9110 token (a method, a header
// name).
func validToken[T string | []byte](b T) bool {
	if len(b) == 0 {
		return false
	}
	for i := 0; i < len(b); i++ {
		if c := b[i]; c <= ' ' || c >= 0x7f || strings.IndexByte(`"(),/:;<=>?@[\]{}`, c) >= 0 {
			return false
		}
	}
	return true
}

// validTarget reports whether b can be an origin-form target: visible
// ASCII (net/http's own parse decides the rest).
func validTarget(b string) bool {
	for i := 0; i < len(b); i++ {
		if c := b[i]; c <= ' ' || c >= 0x7f {
			return false
		}
	}
	return true
}

// validValue reports whether b is a header value net/http takes: no
// control character but the tab.
func validValue(b string) bool {
	for i := 0; i < len(b); i++ {
		if c := b[i]; c < ' ' && c != '\t' || c == 0x7f {
			return false
		}
	}
	return true
}

// commonKeys are header names requests carry, canonical, so that parsing
// one does not allocate its name.
var commonKeys = func() map[string]string {
	m := map[string]string{}
	for _, k := range []string{
		"Accept", "Accept-Encoding", "Accept-Language", "Authorization", "Cache-Control", "Connection",
		"Content-Length", "Content-Type", "Expect", "Host", "Traceparent", "Tracestate", "Upgrade",
		"Transfer-Encoding", "User-Agent", "X-Request-Id", "Openai-Organization", "Openai-Project",
		"X-Stainless-Arch", "X-Stainless-Lang", "X-Stainless-Os", "X-Stainless-Package-Version",
		"X-Stainless-Retry-Count", "X-Stainless-Runtime", "X-Stainless-Runtime-Version",
		"X-Stainless-Async", "X-Stainless-Read-Timeout", "X-Stainless-Timeout", "Baggage",
	} {
		m[k] = k
		m[strings.ToLower(k)] = k
	}
	return m
}()

// canonicalKey is textproto.CanonicalMIMEHeaderKey, without allocating
// for the names requests usually carry.
func canonicalKey(name string) string {
	if k, ok := commonKeys[name]; ok {
		return k
	}
	return textproto.CanonicalMIMEHeaderKey(name)
}

// appendHead appends w's status line and header. length is the body's
// length, or negative for a chunked body.
func (c *conn) appendHead(b []byte, w *response, length int) []byte {
	b = append(b, "HTTP/1.1 "...)
	b = strconv.AppendInt(b, int64(w.status), 10)
	b = append(b, ' ')
	b = append(b, http.StatusText(w.status)...)
	b = append(b, "\r\n"...)
	noBody := w.status == http.StatusNoContent || w.status == http.StatusNotModified
	for k, vs := range w.header {
		switch k {
		case "Content-Length", "Transfer-Encoding", "Connection", "Date":
			continue // this server's own, below
		}
		if !validToken([]byte(k)) {
			continue // as net/http: a name that cannot be sent is dropped
		}
		for _, v := range vs {
			b = append(b, k...)
			b = append(b, ": "...)
			b = appendValue(b, v)
			b = append(b, "\r\n"...)
		}
	}
	if _, ok := w.header["Content-Type"]; !ok && length > 0 && !noBody {
		b = append(b, "Content-Type: "...)
		b = append(b, http.DetectContentType(w.body)...)
		b = append(b, "\r\n"...)
	}
	if d, ok := w.header["Date"]; ok && len(d) > 0 {
		b = append(b, "Date: "...)
		b = appendValue(b, d[0])
		b = append(b, "\r\n"...)
	} else {
		b = append(b, "Date: "...)
		b = append(b, date()...)
		b = append(b, "\r\n"...)
	}
	switch {
	case noBody:
	case length < 0:
		b = append(b, "Transfer-Encoding: chunked\r\n"...)
	default:
		b = append(b, "Content-Length: "...)
		b = strconv.AppendInt(b, int64(length), 10)
		b = append(b, "\r\n"...)
	}
	if w.closeAft || c.srv.shutting.Load() {
		w.closeAft = true
		b = append(b, "Connection: close\r\n"...)
	}
	return append(b, "\r\n"...)
}

// appendValue appends a header value with any CR or LF as a space, as
// net/http sends it.
func appendValue(b []byte, v string) []byte {
	for i := 0; i < len(v); i++ {
		c := v[i]
		if c == '\r' || c == '\n' {
			c = ' '
		}
		b = append(b, c)
	}
	return b
}

// dateCache is the Date header's value, formatted once a second.
var dateCache atomic.Pointer[cachedDate]

type cachedDate struct {
	sec  int64
	text string
}

func date() string {
	now := time.Now()
	if d := dateCache.Load(); d != nil && d.sec == now.Unix() {
		return d.text
	}
	d := &cachedDate{sec: now.Unix(), text: now.UTC().Format(http.TimeFormat)}
	dateCache.Store(d)
	return d.text
}
