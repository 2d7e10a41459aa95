package loadgen

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
