package simengine

import "strconv"

// API selects the OpenAI API a request body belongs to.
type API int

const (
	// APIChat is POST /v1/chat/completions.
	APIChat API = iota
	// APICompletion is POST /v1/completions.
	APICompletion
)

// String returns "chat" or "completion".
func (a API) String() string {
	switch a {
	case APIChat:
		return "chat"
	case APICompletion:
		return "completion"
	default:
		return "API(" + strconv.Itoa(int(a)) + ")"
	}
}
