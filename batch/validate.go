package batch

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
)

// maxErrors bounds the errors a failed validation reports; the count of
// the others is said in the last entry.
const maxErrors = 100

// lineReader reads a batch input file line by line, each bounded by max
// bytes; blank lines are skipped. Line numbers are 1-based, as OpenAI's
// errors give them.
type lineReader struct {
	r    *bufio.Reader
	max  int
	line int
	buf  []byte
}

func newLineReader(r io.Reader, max int) *lineReader {
	return &lineReader{r: bufio.NewReaderSize(r, 64<<10), max: max}
}

var errLineTooLong = errors.New("line too long")

// next returns the next non-blank line (valid until the next call) and its
// number; io.EOF at the end. A line over the bound is returned as
// errLineTooLong (the rest of it skipped), and reading goes on after it.
func (l *lineReader) next() ([]byte, int, error) {
	for {
		l.buf = l.buf[:0]
		l.line++
		tooLong := false
		for {
			frag, err := l.r.ReadSlice('\n')
			if !tooLong {
				if len(l.buf)+len(frag) > l.max+1 { // +1: the newline
					tooLong = true
					l.buf = l.buf[:0]
				} else {
					l.buf = append(l.buf, frag...)
				}
			}
			if err == bufio.ErrBufferFull {
				continue
			}
			if err != nil && err != io.EOF {
				return nil, l.line, err
			}
			if tooLong {
				return nil, l.line, errLineTooLong
			}
			b := bytes.TrimSpace(l.buf)
			if len(b) > 0 {
				return b, l.line, nil
			}
			if err == io.EOF {
				return nil, l.line, io.EOF
			}
			break
		}
	}
}

// parsed is one input line as the driver runs it.
type parsed struct {
	customID string
	body     []byte
	model    string
}

// parseLine checks one input line against the batch's endpoint; the entry
// says why it is refused.
func parseLine(b []byte, endpoint string, known func(string) bool) (parsed, *ErrorEntry) {
	var in inputLine
	if err := json.Unmarshal(b, &in); err != nil {
		return parsed{}, &ErrorEntry{Code: "invalid_json_line", Message: "This line is not parseable as valid JSON."}
	}
	switch {
	case in.CustomID == nil || *in.CustomID == "":
		return parsed{}, &ErrorEntry{Code: "missing_required_parameter", Message: "Missing required parameter: 'custom_id'.", Param: ptr("custom_id")}
	case in.Method == nil || *in.Method != "POST":
		return parsed{}, &ErrorEntry{Code: "invalid_value", Message: "Invalid value for 'method': only POST is supported.", Param: ptr("method")}
	case in.URL == nil || *in.URL != endpoint:
		return parsed{}, &ErrorEntry{Code: "invalid_url", Message: fmt.Sprintf("The URL provided for this request does not match the batch endpoint %s.", endpoint), Param: ptr("url")}
	}
	var body struct {
		Model *string `json:"model"`
	}
	if len(in.Body) == 0 || in.Body[0] != '{' || json.Unmarshal(in.Body, &body) != nil {
		return parsed{}, &ErrorEntry{Code: "invalid_request", Message: "The 'body' of this request must be a JSON object.", Param: ptr("body")}
	}
	if body.Model == nil || *body.Model == "" {
		return parsed{}, &ErrorEntry{Code: "missing_required_parameter", Message: "Missing required parameter: 'body.model'.", Param: ptr("body.model")}
	}
	if !known(*body.Model) {
		return parsed{}, &ErrorEntry{Code: "model_not_found", Message: fmt.Sprintf("The model '%s' does not exist or is not served here.", *body.Model), Param: ptr("body.model")}
	}
	return parsed{customID: *in.CustomID, body: in.Body, model: *body.Model}, nil
}

// validate reads a batch's whole input once, with bounded memory: one line
// at a time, and a set of custom_id digests (16 bytes each, at most
// maxLines of them) to find duplicates. It returns the number of lines, or
// the errors that fail the batch.
func validate(ctx context.Context, r io.Reader, endpoint string, maxLine, maxLines int, models []string) (int, []ErrorEntry, error) {
	known := func(m string) bool { return slices.Contains(models, m) }
	lr := newLineReader(r, maxLine)
	seen := map[[16]byte]struct{}{}
	var errs []ErrorEntry
	extra := 0
	add := func(e ErrorEntry, line int) {
		if len(errs) >= maxErrors {
			extra++
			return
		}
		e.Line = ptr(line)
		errs = append(errs, e)
	}
	n := 0
	for {
		if err := ctx.Err(); err != nil {
			return 0, nil, err
		}
		b, line, err := lr.next()
		if err == io.EOF {
			break
		}
		if errors.Is(err, errLineTooLong) {
			add(ErrorEntry{Code: "line_too_long", Message: fmt.Sprintf("This line is longer than %d bytes.", maxLine)}, line)
			n++
			continue
		}
		if err != nil {
			return 0, nil, err
		}
		n++
		if n > maxLines {
			add(ErrorEntry{Code: "too_many_requests", Message: fmt.Sprintf("A batch holds at most %d requests.", maxLines)}, line)
			break
		}
		p, e := parseLine(b, endpoint, known)
		if e != nil {
			add(*e, line)
			continue
		}
		d := sha256.Sum256([]byte(p.customID))
		var k [16]byte
		copy(k[:], d[:16])
		if _, dup := seen[k]; dup {
			add(ErrorEntry{Code: "duplicate_custom_id", Message: "The custom_id for this request is a duplicate of another request. The custom_id parameter must be unique for each individual request in a batch.", Param: ptr("custom_id")}, line)
			continue
		}
		seen[k] = struct{}{}
	}
	if n == 0 {
		errs = append(errs, ErrorEntry{Code: "empty_file", Message: "The batch input file is empty."})
	}
	if extra > 0 {
		errs = append(errs, ErrorEntry{Code: "too_many_errors", Message: fmt.Sprintf("%d more lines were refused.", extra)})
	}
	return n, errs, nil
}
