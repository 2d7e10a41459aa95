package broker

import (
	"strings"
	"time"
)

// attemptIdentity tells the reply goroutine which chunks are the current
// attempt's next: the reader writes it when it starts an attempt, the
// reply goroutine checks every chunk against it and advances the
// sequence and the speakers. Call.mu guards every field.
type attemptIdentity struct {
	attempt uint32
	secret  uint64 // the current attempt's (see wire.Job.secret)
	nextSeq uint64
	speaker string // the agent whose stream of this attempt is relayed
	// prefillSpeaker is the agent whose prefill leg of this (PD) attempt
	// is listened to; others is when each other agent found running the
	// attempt was last told to stop (see stopOther).
	prefillSpeaker string
	others         map[string]time.Time
	// gapAt is the sequence number found missing in the current attempt
	// (see sequence).
	gapAt uint64
}

// Where a chunk stands in its attempt's sequence (see sequence).
const (
	seqNext      = iota // the one expected: relayed
	seqDuplicate        // one already relayed (sent again after a reconnect): dropped
	seqGap              // past a missing one: dropped, with the rest of the attempt
)

// sequence places seq, the sequence number of a chunk of the current
// attempt's stream, and advances the sequence past a chunk in order. At a
// gap the number missing is kept in gapAt and every later chunk of the
// attempt is dropped: the reader repairs the stream with a retry or a
// migration. Call.mu is held.
func (a *attemptIdentity) sequence(seq uint64) int {
	switch {
	case seq < a.nextSeq:
		return seqDuplicate
	case seq > a.nextSeq:
		a.gapAt = a.nextSeq
		a.nextSeq = ^uint64(0) // drop the rest of this attempt
		return seqGap
	}
	a.nextSeq++
	return seqNext
}

// stopOtherLocked reports whether an agent found running the current
// attempt beside its speaker should be told to stop now: once, and again
// at most once a second while it still speaks (its cancel may have been
// lost in a reconnect). Call.mu is held.
func (a *attemptIdentity) stopOtherLocked(agent string) bool {
	now := time.Now()
	if last, ok := a.others[agent]; ok && now.Sub(last) < time.Second {
		return false
	}
	if a.others == nil {
		a.others = make(map[string]time.Time, 1)
	}
	a.others[strings.Clone(agent)] = now // not the message's bytes
	return true
}
