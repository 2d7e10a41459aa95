package wire

import (
	"slices"
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// AppendJob appends the protobuf encoding of j to buf: the bytes
// proto.MarshalOptions{Deterministic: true} gives (fields in number
// order, zero values left out, trace entries by key), and its refusal of
// a string that is not UTF-8, without its reflection. It is the broker's
// encoder for the job of every attempt.
//
// A job with unknown fields anywhere is left to proto.MarshalAppend: only
// a message decoded from a newer peer has them.
func AppendJob(buf []byte, j *Job) ([]byte, error) {
	if len(j.unknownFields) > 0 || (j.Pd != nil && len(j.Pd.unknownFields) > 0) ||
		(j.Continuation != nil && len(j.Continuation.unknownFields) > 0) ||
		unknownTime(j.Deadline) || unknownTime(j.HandoffExpires) {
		return proto.MarshalOptions{Deterministic: true}.MarshalAppend(buf, j)
	}
	n := 96 + len(j.RequestId) + len(j.Model) + len(j.Body) + len(j.ReplySubject) + len(j.ClientRequestId) +
		len(j.BrokerId) + len(j.PdPair)
	for k, v := range j.Trace {
		n += 8 + len(k) + len(v)
	}
	if p := j.Pd; p != nil {
		n += 48 + len(p.Protocol) + len(p.PrefillAgent) + len(p.BootstrapHost) + len(p.KvTransferParamsJson)
	}
	if c := j.Continuation; c != nil {
		n += 16 + len(c.Text)
	}
	buf = grow(buf, n)
	var err error
	if buf, err = appendString(buf, 1, j.RequestId); err != nil {
		return buf, err
	}
	buf = appendVarint(buf, 2, uint64(j.Attempt))
	if buf, err = appendString(buf, 3, j.Model); err != nil {
		return buf, err
	}
	buf = appendVarint(buf, 4, uint64(int64(j.Api)))
	buf = appendBool(buf, 5, j.Stream)
	buf = appendBytes(buf, 6, j.Body)
	if buf, err = appendString(buf, 7, j.ReplySubject); err != nil {
		return buf, err
	}
	buf = appendTime(buf, 8, j.Deadline)
	if len(j.Trace) > 0 {
		var few [4]string // a trace context has two members
		keys := few[:0]
		for k := range j.Trace {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for _, k := range keys {
			v := j.Trace[k]
			// A map entry always carries its key and value fields, even
			// when empty.
			buf = protowire.AppendTag(buf, 9, protowire.BytesType)
			buf = protowire.AppendVarint(buf, uint64(entrySize(len(k))+entrySize(len(v))))
			if buf, err = appendEntryString(buf, 1, k); err != nil {
				return buf, err
			}
			if buf, err = appendEntryString(buf, 2, v); err != nil {
				return buf, err
			}
		}
	}
	if buf, err = appendString(buf, 10, j.ClientRequestId); err != nil {
		return buf, err
	}
	if buf, err = appendString(buf, 11, j.BrokerId); err != nil {
		return buf, err
	}
	if p := j.Pd; p != nil {
		size := bytesSize(1, len(p.Protocol)) + bytesSize(2, len(p.PrefillAgent)) + bytesSize(3, len(p.BootstrapHost)) +
			varintSize(4, uint64(p.BootstrapPort)) + varintSize(5, p.BootstrapRoom) + bytesSize(6, len(p.KvTransferParamsJson))
		buf = protowire.AppendTag(buf, 12, protowire.BytesType)
		buf = protowire.AppendVarint(buf, uint64(size))
		if buf, err = appendString(buf, 1, p.Protocol); err != nil {
			return buf, err
		}
		if buf, err = appendString(buf, 2, p.PrefillAgent); err != nil {
			return buf, err
		}
		if buf, err = appendString(buf, 3, p.BootstrapHost); err != nil {
			return buf, err
		}
		buf = appendVarint(buf, 4, uint64(p.BootstrapPort))
		buf = appendVarint(buf, 5, p.BootstrapRoom)
		buf = appendBytes(buf, 6, p.KvTransferParamsJson)
	}
	if c := j.Continuation; c != nil {
		buf = protowire.AppendTag(buf, 13, protowire.BytesType)
		buf = protowire.AppendVarint(buf, uint64(bytesSize(1, len(c.Text))+varintSize(2, uint64(c.CompletionTokens))))
		if buf, err = appendString(buf, 1, c.Text); err != nil {
			return buf, err
		}
		buf = appendVarint(buf, 2, uint64(c.CompletionTokens))
	}
	if buf, err = appendString(buf, 14, j.PdPair); err != nil {
		return buf, err
	}
	buf = appendTime(buf, 15, j.HandoffExpires)
	if j.Secret != 0 {
		buf = protowire.AppendTag(buf, 16, protowire.Fixed64Type)
		buf = protowire.AppendFixed64(buf, j.Secret)
	}
	buf = appendBool(buf, 17, j.Release)
	return buf, nil
}

// unknownTime reports whether a timestamp has unknown fields.
func unknownTime(t *timestamppb.Timestamp) bool {
	return t != nil && len(t.ProtoReflect().GetUnknown()) > 0
}

func appendBool(buf []byte, num protowire.Number, v bool) []byte {
	if !v {
		return buf
	}
	return appendVarint(buf, num, 1)
}

// appendTime appends a Timestamp message field: present, even when zero,
// whenever t is set.
func appendTime(buf []byte, num protowire.Number, t *timestamppb.Timestamp) []byte {
	if t == nil {
		return buf
	}
	secs, nanos := t.GetSeconds(), t.GetNanos()
	buf = protowire.AppendTag(buf, num, protowire.BytesType)
	buf = protowire.AppendVarint(buf, uint64(varintSize(1, uint64(secs))+varintSize(2, uint64(int64(nanos)))))
	buf = appendVarint(buf, 1, uint64(secs))
	return appendVarint(buf, 2, uint64(int64(nanos)))
}

// entrySize is the size of a map entry's key or value field of n bytes:
// written even when empty.
func entrySize(n int) int { return protowire.SizeTag(1) + protowire.SizeBytes(n) }

func appendEntryString(buf []byte, num protowire.Number, s string) ([]byte, error) {
	if !utf8.ValidString(s) {
		return buf, errInvalidUTF8
	}
	buf = protowire.AppendTag(buf, num, protowire.BytesType)
	buf = protowire.AppendVarint(buf, uint64(len(s)))
	return append(buf, s...), nil
}
