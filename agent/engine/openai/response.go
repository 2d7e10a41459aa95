package openai

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httputil"
	"net/textproto"
	"strconv"
	"strings"

	"golang.org/x/net/http/httpguts"
)

// maxHead bounds an answer's status line and header together.
const maxHead = 1 << 20

// maxInterim bounds the 1xx answers skipped before the final one.
const maxInterim = 8

var errBadHead = errors.New("malformed HTTP answer from the engine")

// chunkedCoding is every chunked answer's TransferEncoding (read only).
var chunkedCoding = []string{"chunked"}

// readResponse reads an HTTP/1.x answer's head from br and returns it with
// a Body that reads the rest: chunked (net/http's chunked reader), by
// Content-Length, or to the connection's end. Interim (1xx) answers are
// skipped. It reads what http.ReadResponse reads, with less: no request
// to tie the answer to, and a header map built directly.
func readResponse(br *bufio.Reader) (*http.Response, error) {
	for range maxInterim + 1 {
		resp, err := readHead(br)
		if err != nil {
			return nil, err
		}
		if resp.StatusCode >= 200 {
			if err := frame(resp, br); err != nil {
				return nil, err
			}
			return resp, nil
		}
		if resp.StatusCode == http.StatusSwitchingProtocols {
			return nil, fmt.Errorf("%w: 101 to a POST", errBadHead)
		}
	}
	return nil, fmt.Errorf("%w: more than %d interim answers", errBadHead, maxInterim)
}

// readHead reads one status line and header.
func readHead(br *bufio.Reader) (*http.Response, error) {
	budget := maxHead
	line, err := headLine(br, &budget)
	if err != nil {
		return nil, err
	}
	// HTTP/1.1 200 OK
	proto, rest, ok := strings.Cut(string(line), " ")
	if !ok {
		return nil, fmt.Errorf("%w: status line %q", errBadHead, line)
	}
	major, minor, ok := http.ParseHTTPVersion(proto)
	if !ok || major != 1 {
		return nil, fmt.Errorf("%w: version %q", errBadHead, proto)
	}
	code, reason, _ := strings.Cut(rest, " ")
	status, err := strconv.Atoi(code)
	if err != nil || len(code) != 3 || status < 100 {
		return nil, fmt.Errorf("%w: status %q", errBadHead, code)
	}
	statusText := code
	if trimmed := strings.TrimLeft(reason, " "); len(trimmed) == len(reason) && reason != "" {
		statusText = rest // "200 OK" as it came: no new string
	} else if trimmed != "" {
		statusText += " " + trimmed
	}
	resp := &http.Response{
		Status:     statusText,
		StatusCode: status,
		Proto:      proto,
		ProtoMajor: major,
		ProtoMinor: minor,
		Header:     make(http.Header, 8),
	}
	// The first value of each field takes its slice from one array, as
	// net/textproto does; a repeated field appends to its own.
	vals := make([]string, 8)
	var last string // the field a continuation line extends
	for {
		line, err := headLine(br, &budget)
		if err != nil {
			return nil, err
		}
		if len(line) == 0 {
			return resp, nil
		}
		name, value, err := field(line)
		if err != nil {
			return nil, err
		}
		if name == nil {
			// An obsolete folded line: its value goes on the last field's,
			// after a space.
			vs := resp.Header[last]
			if len(vs) == 0 {
				return nil, fmt.Errorf("%w: continuation line first", errBadHead)
			}
			// An empty one too, as net/http does ("a" and " " make "a ").
			vs[len(vs)-1] = strings.TrimLeft(vs[len(vs)-1]+" "+string(value), " ")
			continue
		}
		last = headerKey(name)
		v := headerValue(value)
		if vs, ok := resp.Header[last]; ok || len(vals) == 0 {
			resp.Header[last] = append(vs, v)
			continue
		}
		vals[0] = v
		resp.Header[last], vals = vals[:1:1], vals[1:]
	}
}

// Fields and values engines send with every answer (vLLM's and SGLang's
// uvicorn, the simulator), taken as they are instead of made anew per
// answer.
var (
	commonKeys   = []string{"Content-Type", "Transfer-Encoding", "Date", "Server", "Content-Length", "Cache-Control", "Connection", "Keep-Alive", "X-Request-Id"}
	commonValues = []string{"text/event-stream", "text/event-stream; charset=utf-8", "chunked", "uvicorn", "no-cache", "application/json", "keep-alive", "close"}
)

// headerKey returns the canonical form of a field name.
func headerKey(name []byte) string {
	for _, k := range commonKeys {
		if asciiEqualFold(name, k) {
			return k
		}
	}
	return textproto.CanonicalMIMEHeaderKey(string(name))
}

// headerValue returns value as a string.
func headerValue(value []byte) string {
	for _, v := range commonValues {
		if string(value) == v {
			return v
		}
	}
	return string(value)
}

// asciiEqualFold reports whether b and s are equal, ASCII letters compared
// without case.
func asciiEqualFold(b []byte, s string) bool {
	if len(b) != len(s) {
		return false
	}
	for i := range len(b) {
		x, y := b[i], s[i]
		if x == y {
			continue
		}
		if x|0x20 != y|0x20 || x|0x20 < 'a' || x|0x20 > 'z' {
			return false
		}
	}
	return true
}

// field splits a header line into its name and its trimmed value; a
// folded line (one that starts with a space) has no name.
func field(line []byte) (name, value []byte, err error) {
	if !validHeaderValue(line) {
		return nil, nil, fmt.Errorf("%w: header line %q", errBadHead, line)
	}
	if line[0] == ' ' || line[0] == '\t' {
		return nil, bytes.Trim(line, " \t"), nil
	}
	name, value, ok := bytes.Cut(line, []byte(":"))
	if !ok || !validFieldName(name) {
		return nil, nil, fmt.Errorf("%w: header line %q", errBadHead, line)
	}
	return name, bytes.Trim(value, " \t"), nil
}

// headLine reads one line of a head, without its CRLF (or bare LF),
// charging it to budget.
func headLine(br *bufio.Reader, budget *int) ([]byte, error) {
	line, err := br.ReadSlice('\n')
	if errors.Is(err, bufio.ErrBufferFull) {
		// A long line (a long header value): gathered whole, within budget.
		full := append([]byte(nil), line...)
		for errors.Is(err, bufio.ErrBufferFull) && len(full) <= *budget {
			line, err = br.ReadSlice('\n')
			full = append(full, line...)
		}
		line = full
	}
	*budget -= len(line)
	if *budget < 0 {
		return nil, fmt.Errorf("%w: head longer than %d bytes", errBadHead, maxHead)
	}
	if err != nil {
		if errors.Is(err, io.EOF) {
			return nil, io.ErrUnexpectedEOF
		}
		return nil, err
	}
	line = line[:len(line)-1]
	if n := len(line); n > 0 && line[n-1] == '\r' {
		line = line[:n-1]
	}
	return line, nil
}

// validFieldName reports whether name is a header field name: a token.
func validFieldName(name []byte) bool {
	if len(name) == 0 {
		return false
	}
	for _, b := range name {
		if !tokenByte(b) {
			return false
		}
	}
	return true
}

func tokenByte(b byte) bool {
	return b > ' ' && b < 0x7f && strings.IndexByte(`"(),/:;<=>?@[\]{}`, b) < 0
}

// validTrailer reports whether line is a line of a trailer section as
// net/http's reader takes it (textproto): a field, whose name may hold
// spaces (go.dev/issue/34540), or, but for the section's first line, the
// continuation of the field before it. The fields are dropped.
func validTrailer(line []byte, first bool) bool {
	if !validHeaderValue(line) {
		return false
	}
	if line[0] == ' ' || line[0] == '\t' {
		return !first
	}
	name, _, ok := bytes.Cut(line, []byte(":"))
	if !ok || len(name) == 0 {
		return false
	}
	for _, b := range name {
		if b != ' ' && !tokenByte(b) {
			return false
		}
	}
	return true
}

// frame sets resp's Body, ContentLength, TransferEncoding and Close from
// its status and header (RFC 9112, section 6).
func frame(resp *http.Response, br *bufio.Reader) error {
	h := resp.Header
	resp.Close = resp.ProtoMinor == 0 && !httpguts.HeaderValuesContainsToken(h["Connection"], "keep-alive")
	if httpguts.HeaderValuesContainsToken(h["Connection"], "close") {
		resp.Close = true
		delete(h, "Connection") // as net/http does: Close says it
	}
	resp.ContentLength = -1
	// A coding other than chunked is refused whatever the status, as
	// net/http refuses it.
	te := h["Transfer-Encoding"]
	if len(te) > 0 && (len(te) != 1 || !strings.EqualFold(te[0], "chunked") || resp.ProtoMinor == 0) {
		return fmt.Errorf("%w: transfer encoding %q", errBadHead, te)
	}
	switch {
	case resp.StatusCode == http.StatusNoContent || resp.StatusCode == http.StatusNotModified:
		resp.ContentLength = 0
		resp.Body = http.NoBody
		return nil
	case len(te) > 0:
		// The chunks frame the body; like net/http, the coding moves
		// from the header to TransferEncoding.
		delete(h, "Content-Length")
		delete(h, "Transfer-Encoding")
		resp.TransferEncoding = chunkedCoding
		resp.Body = &chunkedBody{br: br}
		return nil
	case len(h["Content-Length"]) > 0:
		cl := h["Content-Length"]
		for _, v := range cl[1:] {
			if v != cl[0] {
				return fmt.Errorf("%w: content lengths %q", errBadHead, cl)
			}
		}
		n, err := strconv.ParseUint(cl[0], 10, 63)
		if err != nil {
			return fmt.Errorf("%w: content length %q", errBadHead, cl[0])
		}
		resp.ContentLength = int64(n)
		if n == 0 {
			resp.Body = http.NoBody
			return nil
		}
		resp.Body = &lengthBody{r: br, left: int64(n)}
		return nil
	}
	// No framing: the body is the rest of the connection.
	resp.Close = true
	resp.Body = io.NopCloser(br)
	return nil
}

// lengthBody reads a body of a known length; the connection ending
// before it is io.ErrUnexpectedEOF.
type lengthBody struct {
	r    io.Reader
	left int64
}

func (b *lengthBody) Read(p []byte) (int, error) {
	if b.left <= 0 {
		return 0, io.EOF
	}
	if int64(len(p)) > b.left {
		p = p[:b.left]
	}
	n, err := b.r.Read(p)
	b.left -= int64(n)
	if errors.Is(err, io.EOF) && b.left > 0 {
		err = io.ErrUnexpectedEOF
	} else if b.left == 0 && err == nil {
		err = io.EOF
	}
	return n, err
}

func (b *lengthBody) Close() error { return nil }

// chunkedBody reads a chunked body and, at its end, the trailer section,
// so the connection is left at the next answer's first byte.
type chunkedBody struct {
	br  *bufio.Reader
	cr  io.Reader // made by the first Read: an SSE answer is read raw
	err error     // sticky: io.EOF after the trailers, or what broke the body
}

func (b *chunkedBody) Read(p []byte) (int, error) {
	if b.err != nil {
		return 0, b.err
	}
	if b.cr == nil {
		b.cr = httputil.NewChunkedReader(b.br)
	}
	n, err := b.cr.Read(p)
	if errors.Is(err, io.EOF) {
		err = b.trailers()
	}
	if err != nil {
		b.err = err
	}
	return n, err
}

// trailers reads the trailer section after the last chunk; its fields
// are dropped (nothing the adapter reads travels there).
func (b *chunkedBody) trailers() error {
	budget := maxHead
	first := true
	for {
		line, err := headLine(b.br, &budget)
		if err != nil {
			return err
		}
		if len(line) == 0 {
			return io.EOF
		}
		if !validTrailer(line, first) {
			return fmt.Errorf("%w: trailer line %q", errBadHead, line)
		}
		first = false
	}
}

func (b *chunkedBody) Close() error { return nil }
