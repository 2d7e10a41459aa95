package wire

import (
	"bytes"
	"errors"
	"math"
	"strconv"
)

// A cancel (published on sy.cancel.<request>) carries which attempts it
// stops and, optionally, at which agent:
//
//	""              every attempt, at every agent
//	"3"             attempts 0 to 3, at every agent
//	"3 agent-7"     attempts 0 to 3, at agent-7 only
//
// The broker names an agent when two run one attempt (an affinity offer
// moved to the shared queue just as its agent took it, an ack lost in a
// failover): the one whose stream is not relayed is stopped, the other
// goes on. An agent that reads a cancel naming another ignores it; one
// too old to know the agent form cannot parse it and ignores it too,
// which stops nobody rather than the wrong one.

// AppendCancel appends the cancel of attempts up to attempt, at agent
// only unless agent is empty.
func AppendCancel(dst []byte, attempt uint32, agent string) []byte {
	dst = strconv.AppendUint(dst, uint64(attempt), 10)
	if agent != "" {
		dst = append(dst, ' ')
		dst = append(dst, agent...)
	}
	return dst
}

// ParseCancel reads a cancel: the highest attempt it stops (every attempt
// for an empty payload) and the agent it names ("" every agent).
func ParseCancel(data []byte) (upTo uint32, agent string, err error) {
	if len(data) == 0 {
		return math.MaxUint32, "", nil
	}
	num, rest, named := bytes.Cut(data, []byte{' '})
	n, err := strconv.ParseUint(string(num), 10, 32)
	if err != nil {
		return 0, "", err
	}
	if named {
		if len(rest) == 0 {
			return 0, "", errors.New("wire: cancel names an empty agent")
		}
		agent = string(rest)
	}
	return uint32(n), agent, nil
}
