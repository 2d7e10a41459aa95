package simengine

import "strings"

// Expectation is what a request must receive from the simulator.
type Expectation struct {
	// Text is the whole generated text (the concatenated deltas).
	Text string
	// Tokens are the streamed deltas in order: " " + word each, and a last
	// partial one when a stop string cut a token (not counted).
	Tokens           []string
	PromptTokens     int
	CompletionTokens int
	// FinishReason is "stop" or "length".
	FinishReason string
}

// Expect computes, without any timing, what a request with body receives.
// It validates body as the engine does, except for the model name, which
// only an Engine knows; errors are *Error.
func Expect(api API, body []byte) (Expectation, error) {
	r, err := parseRequest(api, body)
	if err != nil {
		return Expectation{}, err
	}
	return expect(r.outcome()), nil
}

// ExpectChoices is Expect for each of the request's n choices, in index
// order; choice 0 is what Expect gives.
func ExpectChoices(api API, body []byte) ([]Expectation, error) {
	r, err := parseRequest(api, body)
	if err != nil {
		return nil, err
	}
	xs := make([]Expectation, r.n)
	for i := range xs {
		xs[i] = expect(r.choiceOutcome(i))
	}
	return xs, nil
}

func expect(o outcome) Expectation {
	x := Expectation{
		Tokens:           make([]string, 0, o.tokens+1),
		PromptTokens:     o.promptTokens,
		CompletionTokens: o.tokens,
		FinishReason:     o.finish,
	}
	c := o.start
	var sb strings.Builder
	for range o.tokens {
		w, _ := c.next()
		x.Tokens = append(x.Tokens, tokenText[w])
		sb.WriteString(tokenText[w])
	}
	if o.tail != "" {
		x.Tokens = append(x.Tokens, o.tail)
		sb.WriteString(o.tail)
	}
	x.Text = sb.String()
	return x
}
