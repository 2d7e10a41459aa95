package batch

import "encoding/json"

// File is OpenAI's file object.
type File struct {
	ID        string `json:"id"`
	Object    string `json:"object"`
	Bytes     int64  `json:"bytes"`
	CreatedAt int64  `json:"created_at"`
	ExpiresAt *int64 `json:"expires_at"`
	Filename  string `json:"filename"`
	Purpose   string `json:"purpose"`
	Status    string `json:"status"`

	owner string
}

// Batch statuses, as OpenAI names them.
const (
	StatusValidating = "validating"
	StatusFailed     = "failed"
	StatusInProgress = "in_progress"
	StatusFinalizing = "finalizing"
	StatusCompleted  = "completed"
	StatusExpired    = "expired"
	StatusCancelling = "cancelling"
	StatusCancelled  = "cancelled"
)

// terminal reports whether a batch in status s is done for good.
func terminal(s string) bool {
	switch s {
	case StatusFailed, StatusCompleted, StatusExpired, StatusCancelled:
		return true
	}
	return false
}

// Batch is OpenAI's batch object.
type Batch struct {
	ID               string            `json:"id"`
	Object           string            `json:"object"`
	Endpoint         string            `json:"endpoint"`
	Errors           *Errors           `json:"errors"`
	InputFileID      string            `json:"input_file_id"`
	CompletionWindow string            `json:"completion_window"`
	Status           string            `json:"status"`
	OutputFileID     *string           `json:"output_file_id"`
	ErrorFileID      *string           `json:"error_file_id"`
	CreatedAt        int64             `json:"created_at"`
	InProgressAt     *int64            `json:"in_progress_at"`
	ExpiresAt        *int64            `json:"expires_at"`
	FinalizingAt     *int64            `json:"finalizing_at"`
	CompletedAt      *int64            `json:"completed_at"`
	FailedAt         *int64            `json:"failed_at"`
	ExpiredAt        *int64            `json:"expired_at"`
	CancellingAt     *int64            `json:"cancelling_at"`
	CancelledAt      *int64            `json:"cancelled_at"`
	RequestCounts    RequestCounts     `json:"request_counts"`
	Metadata         map[string]string `json:"metadata"`
}

// RequestCounts is a batch's request_counts: completed counts the lines
// answered with a 2xx, failed every other line.
type RequestCounts struct {
	Total     int `json:"total"`
	Completed int `json:"completed"`
	Failed    int `json:"failed"`
}

// Errors is a batch's errors object: why its input was refused.
type Errors struct {
	Object string       `json:"object"`
	Data   []ErrorEntry `json:"data"`
}

// ErrorEntry is one refusal of a batch's input.
type ErrorEntry struct {
	Code    string  `json:"code"`
	Message string  `json:"message"`
	Param   *string `json:"param"`
	Line    *int    `json:"line"`
}

// record is a batch as the KV bucket holds it: the client's object, whose
// key owns it, and the driver's progress.
type record struct {
	Batch
	Owner string `json:"x_owner,omitempty"`
	// Driver is the broker driving the batch, Running its lines in flight
	// (as of the driver's last update).
	Driver  string `json:"x_driver,omitempty"`
	Running int    `json:"x_running,omitempty"`
	// End is the status a finalizing batch ends in (completed or expired).
	End string `json:"x_end,omitempty"`
}

// Public returns the client's view of r.
func (r *record) public() *Batch {
	b := r.Batch
	return &b
}

// inputLine is one line of a batch's input file.
type inputLine struct {
	CustomID *string         `json:"custom_id"`
	Method   *string         `json:"method"`
	URL      *string         `json:"url"`
	Body     json.RawMessage `json:"body"`
}

// result is one line's outcome as the KV bucket holds it, keyed by the
// line's index.
type result struct {
	CustomID  string          `json:"custom_id"`
	Status    int             `json:"status_code,omitempty"`
	RequestID string          `json:"request_id,omitempty"`
	Body      json.RawMessage `json:"body,omitempty"`
	Error     *LineError      `json:"error,omitempty"`
}

func (r *result) ok() bool { return r.Error == nil && r.Status >= 200 && r.Status < 300 }

// LineError is the error member of an output line that has no response.
type LineError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// outputLine is one line of a batch's output or error file, in OpenAI's
// format.
type outputLine struct {
	ID       string     `json:"id"`
	CustomID string     `json:"custom_id"`
	Response *response  `json:"response"`
	Error    *LineError `json:"error"`
}

type response struct {
	StatusCode int             `json:"status_code"`
	RequestID  string          `json:"request_id"`
	Body       json.RawMessage `json:"body"`
}
