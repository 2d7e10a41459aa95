package openaihttp

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/switchyard-ai/switchyard/batch"
	"github.com/switchyard-ai/switchyard/ingress/auth"
)

// handleEach registers one handler per method on path; other methods get
// 405 in OpenAI's shape.
func (s *Server) handleEach(path string, hs map[string]http.HandlerFunc) {
	methods := make([]string, 0, len(hs))
	for m := range hs {
		methods = append(methods, m)
	}
	slices.Sort(methods)
	allow := strings.Join(methods, ", ")
	s.mux.HandleFunc(path, func(w http.ResponseWriter, r *http.Request) {
		m := r.Method
		if m == http.MethodHead {
			m = http.MethodGet
		}
		h, ok := hs[m]
		if !ok {
			w.Header().Set("Allow", allow)
			writeError(w, &apiError{Status: http.StatusMethodNotAllowed, Message: r.Method + " not allowed on " + path + "; use " + allow, Type: "invalid_request_error", Code: strp("method_not_allowed")})
			return
		}
		h(w, r)
	})
}

// fromBatch maps the batch store's errors to HTTP.
func fromBatch(err error, what string) *apiError {
	var ie *batch.InvalidError
	switch {
	case errors.As(err, &ie):
		return invalid(ie.Message, ie.Param, "invalid_value")
	case errors.Is(err, batch.ErrNotFound):
		return &apiError{Status: http.StatusNotFound, Message: "No such " + what + " object: " + err.Error(), Type: "invalid_request_error", Param: strp("id"), Code: strp("not_found")}
	case errors.Is(err, batch.ErrTooLarge):
		return &apiError{Status: http.StatusRequestEntityTooLarge, Message: err.Error() + "; the broker's --max-file-bytes sets this bound", Type: "invalid_request_error", Param: strp("file"), Code: strp("file_too_large")}
	}
	return &apiError{Status: http.StatusServiceUnavailable, Message: err.Error(), Type: "server_error", Code: strp("unavailable"), RetryAfter: 1}
}

type listPage[T any] struct {
	Object  string  `json:"object"`
	Data    []T     `json:"data"`
	FirstID *string `json:"first_id"`
	LastID  *string `json:"last_id"`
	HasMore bool    `json:"has_more"`
}

func page[T any](data []T, id func(T) string, more bool) listPage[T] {
	p := listPage[T]{Object: "list", Data: data, HasMore: more}
	if p.Data == nil {
		p.Data = []T{}
	}
	if len(data) > 0 {
		f, l := id(data[0]), id(data[len(data)-1])
		p.FirstID, p.LastID = &f, &l
	}
	return p
}

// progressReader moves the connection's read deadline on while an upload
// arrives: each mebibyte read buys another body read timeout, so a large
// file at any reasonable rate gets in, and a client that stops sending is
// still cut off.
type progressReader struct {
	r       io.Reader
	rc      *http.ResponseController
	timeout time.Duration
	since   int64
}

func (p *progressReader) Read(b []byte) (int, error) {
	n, err := p.r.Read(b)
	p.since += int64(n)
	if p.since >= 1<<20 {
		p.since = 0
		_ = p.rc.SetReadDeadline(time.Now().Add(p.timeout))
	}
	return n, err
}

// progressWriter moves the write deadline on while a download goes out,
// as a stream's writes do.
type progressWriter struct {
	w       io.Writer
	rc      *http.ResponseController
	timeout time.Duration
	since   int64
}

func (p *progressWriter) Write(b []byte) (int, error) {
	if p.since == 0 || p.since >= 1<<20 {
		p.since = 0
		_ = p.rc.SetWriteDeadline(time.Now().Add(p.timeout))
	}
	n, err := p.w.Write(b)
	p.since += int64(n) + 1
	return n, err
}

// createFile serves POST /v1/files: a multipart form with a file part and
// purpose "batch". The file part is streamed into the Object Store as it
// arrives; a purpose other than batch, read after it, deletes it again.
func (s *Server) createFile(w http.ResponseWriter, r *http.Request) {
	mr, err := r.MultipartReader()
	if err != nil {
		writeError(w, invalid("want a multipart/form-data body: "+err.Error(), "", "invalid_request"))
		return
	}
	ctx, owner := r.Context(), auth.Owner(r.Context())
	var f *batch.File
	purpose := ""
	fail := func(e *apiError) {
		if f != nil {
			_ = s.cfg.Batch.DeleteFile(ctx, owner, f.ID)
		}
		writeError(w, e)
	}
	body := &progressReader{rc: http.NewResponseController(w), timeout: s.cfg.BodyReadTimeout}
	for {
		part, err := mr.NextPart()
		if err == io.EOF {
			break
		}
		if err != nil {
			fail(invalid("reading the multipart body: "+err.Error(), "", "invalid_request"))
			return
		}
		switch part.FormName() {
		case "purpose":
			v, _ := io.ReadAll(io.LimitReader(part, 64))
			purpose = string(v)
			if purpose != "batch" {
				fail(invalid(fmt.Sprintf("purpose %q is not stored here: only \"batch\" is", purpose), "purpose", "invalid_value"))
				return
			}
		case "file":
			if f != nil {
				fail(invalid("more than one file part", "file", "invalid_value"))
				return
			}
			name := part.FileName()
			if name == "" {
				name = "upload.jsonl"
			}
			body.r = part
			f, err = s.cfg.Batch.PutFile(ctx, owner, name, "batch", body)
			if err != nil {
				writeError(w, fromBatch(err, "file"))
				return
			}
		default:
			_, _ = io.Copy(io.Discard, io.LimitReader(part, 64<<10))
		}
	}
	switch {
	case f == nil:
		fail(invalid("missing required parameter: 'file'", "file", "missing_required_parameter"))
	case purpose == "":
		fail(invalid("missing required parameter: 'purpose'", "purpose", "missing_required_parameter"))
	default:
		writeJSON(w, http.StatusOK, f)
	}
}

func (s *Server) listFiles(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	p := batch.ListFiles{Purpose: q.Get("purpose"), After: q.Get("after")}
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 10000 {
			writeError(w, invalid("limit: want 1 to 10000", "limit", "invalid_value"))
			return
		}
		p.Limit = n
	}
	switch q.Get("order") {
	case "", "desc":
	case "asc":
		p.Asc = true
	default:
		writeError(w, invalid("order: want asc or desc", "order", "invalid_value"))
		return
	}
	files, more, err := s.cfg.Batch.Files(r.Context(), auth.Owner(r.Context()), p)
	if err != nil {
		writeError(w, fromBatch(err, "file"))
		return
	}
	writeJSON(w, http.StatusOK, page(files, func(f *batch.File) string { return f.ID }, more))
}

func (s *Server) getFile(w http.ResponseWriter, r *http.Request) {
	f, err := s.cfg.Batch.File(r.Context(), auth.Owner(r.Context()), r.PathValue("id"))
	if err != nil {
		writeError(w, fromBatch(err, "file"))
		return
	}
	writeJSON(w, http.StatusOK, f)
}

func (s *Server) deleteFile(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if err := s.cfg.Batch.DeleteFile(r.Context(), auth.Owner(r.Context()), id); err != nil {
		writeError(w, fromBatch(err, "file"))
		return
	}
	writeJSON(w, http.StatusOK, struct {
		ID      string `json:"id"`
		Object  string `json:"object"`
		Deleted bool   `json:"deleted"`
	}{id, "file", true})
}

// fileContent streams a file out of the Object Store.
func (s *Server) fileContent(w http.ResponseWriter, r *http.Request) {
	f, rd, err := s.cfg.Batch.OpenFile(r.Context(), auth.Owner(r.Context()), r.PathValue("id"))
	if err != nil {
		writeError(w, fromBatch(err, "file"))
		return
	}
	defer rd.Close()
	h := w.Header()
	h.Set("Content-Type", "application/octet-stream")
	h.Set("Content-Length", strconv.FormatInt(f.Bytes, 10))
	h.Set("Content-Disposition", fmt.Sprintf("attachment; filename=%q", f.Filename))
	w.WriteHeader(http.StatusOK)
	if r.Method == http.MethodHead {
		return
	}
	out := io.Writer(w)
	if s.cfg.WriteTimeout > 0 {
		out = &progressWriter{w: w, rc: http.NewResponseController(w), timeout: s.cfg.WriteTimeout}
	}
	if _, err := io.Copy(out, rd); err != nil {
		s.log.Warn("file content", "file", f.ID, "err", err)
	}
}
