package simengine

import (
	"strconv"
	"strings"
)

// vocab is the generation vocabulary: plain lowercase ASCII words, so that a
// token's JSON encoding never needs escaping.
var vocab = [...]string{
	"the", "of", "and", "to", "in", "is", "it", "that", "was", "for",
	"on", "are", "with", "as", "his", "they", "at", "be", "this", "from",
	"have", "or", "by", "one", "had", "not", "but", "what", "all", "were",
	"when", "we", "there", "can", "an", "your", "which", "their", "said", "if",
	"do", "will", "each", "about", "how", "up", "out", "them", "then", "she",
	"many", "some", "so", "these", "would", "other", "into", "has", "more", "her",
	"two", "like", "him", "see", "time", "could", "no", "make", "than", "first",
	"been", "its", "who", "now", "people", "my", "made", "over", "did", "down",
	"only", "way", "find", "use", "may", "water", "long", "little", "very", "after",
	"words", "called", "just", "where", "most", "know", "get", "through", "back", "much",
	"go", "good", "new", "write", "our", "me", "man", "too", "any", "day",
	"same", "right", "look", "think", "also", "around", "another", "came", "come", "work",
	"three", "word", "must", "because", "does", "part", "even", "place", "well", "such",
	"here", "take", "why", "things", "help", "put", "years", "different", "away", "again",
	"off", "went", "old", "number", "great", "tell", "men", "say", "small", "every",
	"found", "still", "between", "name", "should", "home", "big", "give", "air", "line",
	"set", "own", "under", "read", "last", "never", "us", "left", "end", "along",
	"while", "might", "next", "sound", "below", "saw", "something", "thought", "both", "few",
	"those", "always", "looked", "show", "large", "often", "together", "asked", "house", "world",
	"going", "want", "school", "important", "until", "form", "food", "keep", "children", "feet",
	"land", "side", "without", "boy", "once", "animals", "life", "enough", "took", "sometimes",
	"four", "head", "above", "kind", "began", "almost", "live", "page", "got", "earth",
	"need", "far", "hand", "high", "year", "mother", "light", "parts", "country", "father",
	"let", "night", "following", "picture", "being", "study", "second", "eyes", "soon", "times",
	"story", "boys", "since", "white", "days", "ever", "paper", "hard", "near", "sentence",
	"better", "best", "across", "during", "today", "others",
}

var (
	// inVocab answers whether a context word could have been generated.
	inVocab = func() map[string]struct{} {
		m := make(map[string]struct{}, len(vocab))
		for _, w := range vocab {
			m[w] = struct{}{}
		}
		return m
	}()
	// tokenText[i] is " " + vocab[i], and tokenJSON[i] its JSON string.
	tokenText, tokenJSON = func() (text, js [len(vocab)]string) {
		for i, w := range vocab {
			text[i] = " " + w
			js[i] = `" ` + w + `"`
		}
		return text, js
	}()
)

const (
	fnvOffset64 = 14695981039346656037
	fnvPrime64  = 1099511628211
	// seed makes the chain specific to this simulator; changing it changes
	// every output, which the broker's end-to-end tests do not care about
	// because they ask Expect.
	seed = "switchyard-sim/v1"
	// eosModulus makes about one step in 40 an end of sequence.
	eosModulus = 40
	// eosMinRun is how many trailing vocabulary words the context must end
	// with before an end of sequence may happen.
	eosMinRun = 4
)

var seedHash = fnvString(fnvOffset64, seed)

func fnvString(h uint64, s string) uint64 {
	for i := 0; i < len(s); i++ {
		h ^= uint64(s[i])
		h *= fnvPrime64
	}
	return h
}

// chain is the Markov state: the last two context words and how many
// trailing context words are vocabulary words. It depends on the context
// only, which is what makes resuming exact.
type chain struct {
	seed   uint64 // seedHash for choice 0, choiceSeed(i) for choice i
	p2, p1 string
	run    int
}

// choiceSeed is the seed of choice i of a request with n > 1: choice 0
// has the simulator's own, so that it is what Expect and a resumed request
// give, and every other choice one of its own.
func choiceSeed(i int) uint64 {
	if i == 0 {
		return seedHash
	}
	h := fnvString(seedHash, "\x00choice ")
	return fnvString(h, strconv.Itoa(i))
}

// newChain scans prompt and returns the chain state after it and the number
// of prompt tokens (strings.Fields words).
func newChain(prompt string) (chain, int) {
	c := chain{seed: seedHash}
	n := 0
	for w := range strings.FieldsSeq(prompt) {
		n++
		c.p2, c.p1 = c.p1, w
		if _, ok := inVocab[w]; ok {
			c.run++
		} else {
			c.run = 0
		}
	}
	return c, n
}

// next returns the index in vocab of the next word, or eos.
func (c *chain) next() (word int, eos bool) {
	h := fnvString(c.seed, c.p2)
	h *= fnvPrime64 // a zero byte between the words: h ^= 0 is a no-op
	h = fnvString(h, c.p1)
	if h%eosModulus == 0 && c.run >= eosMinRun {
		return 0, true
	}
	word = int((h >> 32) % uint64(len(vocab)))
	c.p2, c.p1 = c.p1, vocab[word]
	c.run++
	return word, false
}

// Finish reasons.
const (
	finishStop   = "stop"
	finishLength = "length"
)

// outcome is where a request's generation ends, computed before any timing.
type outcome struct {
	start        chain
	promptTokens int
	// tokens is how many whole tokens are emitted (and counted).
	tokens int
	// tail is the part of the next token before a stop string, emitted but
	// not counted.
	tail   string
	finish string
}

// lastOutput is the output at which o's generation ends: output 0 is the
// first token, i the i-th next token, o.tokens the stop-string tail.
func lastOutput(o outcome) int {
	if o.tail != "" {
		return o.tokens
	}
	return max(0, o.tokens-1)
}

// outcome is choice 0's outcome, what a request with n 1 generates.
func (r *request) outcome() outcome { return r.choiceOutcome(0) }

// choiceOutcome is choice i's outcome.
func (r *request) choiceOutcome(i int) outcome {
	c, n := newChain(r.prompt)
	c.seed = choiceSeed(i)
	o := outcome{start: c, promptTokens: n, finish: finishLength}
	if len(r.stops) == 0 {
		for o.tokens < r.maxTokens {
			if _, eos := c.next(); eos {
				o.finish = finishStop
				break
			}
			o.tokens++
		}
		return o
	}

	// With stop strings the whole text is needed to find the earliest match,
	// including one spanning tokens.
	var text []byte
	ends := make([]int, 0, 64) // ends[i] is the end offset of token i in text
	eos := false
	for len(ends) < r.maxTokens {
		w, e := c.next()
		if e {
			eos = true
			break
		}
		text = append(text, tokenText[w]...)
		ends = append(ends, len(text))
	}
	cut := -1
	all := string(text)
	for _, s := range r.stops {
		if i := strings.Index(all, s); i >= 0 && (cut < 0 || i < cut) {
			cut = i
		}
	}
	if cut < 0 {
		o.tokens = len(ends)
		if eos {
			o.finish = finishStop
		}
		return o
	}
	o.finish = finishStop
	start := 0
	for o.tokens < len(ends) && ends[o.tokens] <= cut {
		start = ends[o.tokens]
		o.tokens++
	}
	o.tail = all[start:cut]
	return o
}
