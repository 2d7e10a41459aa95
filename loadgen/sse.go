package loadgen

import (
	"bufio"
	"bytes"
	"errors"
	"io"
)

// sseReader yields the data of server-sent events from r. Lines come from
// bufio.Reader.ReadSlice, so reading allocates nothing once data has grown
// to the longest event.
type sseReader struct {
	r         *bufio.Reader
	data      []byte // data of the event being assembled
	line      []byte // a line longer than r's buffer
	hasData   bool
	errorType bool // an "event: error" line
}

// next returns the data of the next event, valid until the following call,
// and whether the event was typed "error". At the end of the stream it
// returns io.EOF, after a final event not terminated by a blank line.
func (s *sseReader) next() (data []byte, isError bool, err error) {
	s.data = s.data[:0]
	s.hasData, s.errorType = false, false
	for {
		line, err := s.readLine()
		if err != nil {
			if errors.Is(err, io.EOF) && s.hasData {
				return s.data, s.errorType, nil
			}
			return nil, false, err
		}
		if len(line) == 0 {
			if s.hasData {
				return s.data, s.errorType, nil
			}
			s.errorType = false // an event without data is not dispatched
			continue
		}
		field, value := line, []byte(nil)
		if i := bytes.IndexByte(line, ':'); i >= 0 {
			field, value = line[:i], line[i+1:]
			if len(value) > 0 && value[0] == ' ' {
				value = value[1:]
			}
		}
		switch string(field) { // no allocation: the compiler special-cases this
		case "data":
			if s.hasData {
				s.data = append(s.data, '\n')
			}
			s.data = append(s.data, value...)
			s.hasData = true
		case "event":
			s.errorType = string(value) == "error"
		}
	}
}

// readLine returns the next line without its line ending.
func (s *sseReader) readLine() ([]byte, error) {
	line, err := s.r.ReadSlice('\n')
	if errors.Is(err, bufio.ErrBufferFull) {
		s.line = append(s.line[:0], line...)
		for errors.Is(err, bufio.ErrBufferFull) {
			line, err = s.r.ReadSlice('\n')
			s.line = append(s.line, line...)
		}
		line = s.line
	}
	if err != nil && (!errors.Is(err, io.EOF) || len(line) == 0) {
		return nil, err
	}
	line = bytes.TrimSuffix(line, []byte("\n"))
	return bytes.TrimSuffix(line, []byte("\r")), nil
}

// event is what the client needs from one chunk.
type event struct {
	content      bool // non-empty content or text
	err          bool // a top-level "error" member
	usage        bool
	promptTokens int
	outTokens    int
}

// scanEvent classifies an OpenAI stream chunk without decoding it. It looks
// for object keys anywhere in the chunk: a string followed by ':' can only
// be a key in JSON, and the chunks of a streamed completion carry no nested
// objects with these keys except "usage"'s counters. A key whose value is
// not a string (logprobs' "content" array, a null) is not content.
func scanEvent(b []byte) event {
	var ev event
	for i := 0; i < len(b); i++ {
		if b[i] != '"' {
			continue
		}
		end := stringEnd(b, i+1)
		if end < 0 {
			return ev
		}
		key := b[i+1 : end]
		j := skipSpace(b, end+1)
		if j >= len(b) || b[j] != ':' {
			i = end // a string value
			continue
		}
		j = skipSpace(b, j+1)
		switch string(key) {
		case "content", "reasoning_content", "text":
			if j+1 < len(b) && b[j] == '"' && b[j+1] != '"' {
				ev.content = true
			}
		case "error":
			if j < len(b) && b[j] != 'n' { // not null
				ev.err = true
			}
		case "usage":
			if j < len(b) && b[j] == '{' {
				ev.usage = true
			}
		case "completion_tokens":
			ev.outTokens = atoi(b[j:])
		case "prompt_tokens":
			ev.promptTokens = atoi(b[j:])
		}
		i = end
	}
	return ev
}

// stringEnd returns the index of the quote closing the string starting at
// b[i], or -1.
func stringEnd(b []byte, i int) int {
	for ; i < len(b); i++ {
		switch b[i] {
		case '\\':
			i++
		case '"':
			return i
		}
	}
	return -1
}

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

func atoi(b []byte) int {
	n := 0
	for _, c := range b {
		if c < '0' || c > '9' || n > 1<<40 {
			break
		}
		n = n*10 + int(c-'0')
	}
	return n
}
