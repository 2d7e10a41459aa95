// Package h1 is the broker's own HTTP/1.1 server, for the requests it
// serves by the thousand a second (the completion posts) and the rest of
// its plain GETs and POSTs.
//
// net/http spends, per request on a kept-alive connection, a goroutine
// for the background read that notices a client going away, a deadline
// in the past to stop it before the next request, two buffered writers
// with a chunk writer between them, a copy of the header map and a Date
// formatted per response: at 64 streams of one-token requests the
// connection's own work was a third of the broker's CPU. Here each
// connection has two long-lived goroutines, a reader that parses requests
// and then waits on the connection for the client's next bytes or its
// end (which cancels the running request), and a handler goroutine; the
// response writes straight to the connection, one write(2) per flush. On
// a plain TCP connection the reader waits inside one raw read of the
// socket for as long as requests come whole, one after another's
// response: one read(2) per request, where Go's Read makes two (the first
// finds nothing), with a one-time check of the socket for a client that
// left as it sent its request (see watchRaw).
//
// It serves only what it is sure of: HTTP/1.1 requests with a
// Content-Length body, one Host and plain CRLF lines, for the methods and
// routes Fast names. Anything else (another method, a chunked body,
// HTTP/1.0, an odd header, h2 over TLS) goes, with its connection and the
// bytes read so far, to a net/http server with the same handler, which
// serves it and every later request on that connection as it always did.
//
// A handler gets a ResponseWriter with Flush and what
// http.ResponseController asks of one (SetWriteDeadline; SetReadDeadline
// does nothing, the body being read before the handler runs), and
// WriteNow, for a relay that writes a stream's events from a goroutine of
// its own.
package h1
