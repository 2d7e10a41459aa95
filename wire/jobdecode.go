package wire

import (
	"errors"
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// DecodeJob decodes the protobuf encoding of a Job into job, with
// proto.Unmarshal's result (as proto.Equal compares them) and its verdict
// on every input, though not always its error's text. It is the agent's
// decoder for the jobs it pulls: proto.Unmarshal's generic, table-driven
// decoder was a visible share of an agent's CPU on short requests.
//
// The scalar fields, the trace map, the two timestamps (deadline,
// handoff_expires) and the PD hand-off, on every job of a PD pool, are
// decoded here; the strings are copied, so keeping one (a reply subject
// for a while after the job) does not keep data. A job with a
// continuation, a field this decoder does not
// know (a newer broker's) or a known field with another wire type is
// decoded by proto.Unmarshal instead, from the start, so that nested
// messages and unknown fields come out exactly as it leaves them.
//
// Unlike proto.Unmarshal, the body aliases data (capped at its length, so
// an append to it never writes into data) instead of being a copy, which
// spares copying the prompt of every job: data must not change for as
// long as the body is in use. A NATS message's data, a buffer of its own
// that the subscription hands over and nobody writes, is such a buffer.
// (On the fallback the body is proto.Unmarshal's copy.)
//
// On error job holds part of data.
func DecodeJob(data []byte, job *Job) error {
	proto.Reset(job)
	b := data
	for len(b) > 0 {
		num, typ, n := consumeTag(b)
		if n < 0 {
			return protowire.ParseError(n)
		}
		b = b[n:]
		switch typ {
		case protowire.VarintType:
			if num != 2 && num != 4 && num != 5 && num != 17 {
				return unmarshalJob(data, job)
			}
			v, n := protowire.ConsumeVarint(b)
			if n < 0 {
				return protowire.ParseError(n)
			}
			b = b[n:]
			switch num {
			case 2:
				job.Attempt = uint32(v)
			case 4:
				job.Api = API(int32(v))
			case 5:
				job.Stream = protowire.DecodeBool(v)
			case 17:
				job.Release = protowire.DecodeBool(v)
			}
		case protowire.Fixed64Type:
			if num != 16 {
				return unmarshalJob(data, job)
			}
			v, n := protowire.ConsumeFixed64(b)
			if n < 0 {
				return protowire.ParseError(n)
			}
			b = b[n:]
			job.Secret = v
		case protowire.BytesType:
			if num < 1 || num > 15 || num == 2 || num == 4 || num == 5 || num == 13 {
				// Unknown, another wire type, or a continuation: rare,
				// and left to proto.Unmarshal.
				return unmarshalJob(data, job)
			}
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return protowire.ParseError(n)
			}
			b = b[n:]
			var err error
			switch num {
			case 1:
				job.RequestId, err = copyString(v)
			case 3:
				job.Model, err = copyString(v)
			case 6:
				if len(v) > 0 {
					job.Body = v[:len(v):len(v)]
				} else {
					job.Body = nil // as proto.Unmarshal leaves an empty proto3 bytes field
				}
			case 7:
				job.ReplySubject, err = copyString(v)
			case 8:
				job.Deadline, err = decodeTimestamp(v, job.Deadline)
			case 9:
				if job.Trace == nil {
					job.Trace = make(map[string]string, 1)
				}
				err = decodeTraceEntry(v, job.Trace)
			case 10:
				job.ClientRequestId, err = copyString(v)
			case 11:
				job.BrokerId, err = copyString(v)
			case 12:
				job.Pd, err = decodePD(v, job.Pd)
			case 14:
				job.PdPair, err = copyString(v)
			case 15:
				job.HandoffExpires, err = decodeTimestamp(v, job.HandoffExpires)
			}
			if err == errFallback {
				return unmarshalJob(data, job)
			}
			if err != nil {
				return err
			}
		default:
			// A group or a fixed32, which no field of a Job is:
			// proto.Unmarshal keeps it as an unknown field (or refuses
			// it).
			return unmarshalJob(data, job)
		}
	}
	return nil
}

// errFallback is a nested message's call for proto.Unmarshal to decode the
// job: it holds what DecodeJob does not decode itself.
var errFallback = errors.New("wire: job left to proto.Unmarshal")

// unmarshalJob decodes the whole of data into job with proto.Unmarshal,
// over whatever DecodeJob had set.
func unmarshalJob(data []byte, job *Job) error {
	proto.Reset(job)
	return proto.Unmarshal(data, job)
}

// decodeTimestamp decodes a google.protobuf.Timestamp into ts, or a new
// one when ts is nil, and returns it. Decoding over an earlier occurrence
// of the field is proto's merge of the two: each of its fields is a
// scalar, and the last value of one wins. Anything else in it (an unknown
// field, another wire type) is left to proto.Unmarshal.
func decodeTimestamp(data []byte, ts *timestamppb.Timestamp) (*timestamppb.Timestamp, error) {
	if ts == nil {
		ts = new(timestamppb.Timestamp)
	}
	for len(data) > 0 {
		num, typ, n := consumeTag(data)
		if n < 0 {
			return ts, protowire.ParseError(n)
		}
		data = data[n:]
		if typ != protowire.VarintType || (num != 1 && num != 2) {
			return ts, errFallback
		}
		v, n := protowire.ConsumeVarint(data)
		if n < 0 {
			return ts, protowire.ParseError(n)
		}
		data = data[n:]
		if num == 1 {
			ts.Seconds = int64(v)
		} else {
			ts.Nanos = int32(v)
		}
	}
	return ts, nil
}

// decodePD decodes a PDHandoff into pd, or a new one when pd is nil, and
// returns it. As for a timestamp, decoding over an earlier occurrence is
// proto's merge: every field is a scalar, a string or bytes, and the last
// value of each wins. Its strings and its KV parameters are copied (a
// hand-off is small, and a decode job's is kept while it runs); anything
// else in it is left to proto.Unmarshal.
func decodePD(data []byte, pd *PDHandoff) (*PDHandoff, error) {
	if pd == nil {
		pd = new(PDHandoff)
	}
	for len(data) > 0 {
		num, typ, n := consumeTag(data)
		if n < 0 {
			return pd, protowire.ParseError(n)
		}
		data = data[n:]
		switch {
		case typ == protowire.VarintType && (num == 4 || num == 5):
			v, n := protowire.ConsumeVarint(data)
			if n < 0 {
				return pd, protowire.ParseError(n)
			}
			data = data[n:]
			if num == 4 {
				pd.BootstrapPort = uint32(v)
			} else {
				pd.BootstrapRoom = v
			}
		case typ == protowire.BytesType && num >= 1 && num <= 6 && num != 4 && num != 5:
			v, n := protowire.ConsumeBytes(data)
			if n < 0 {
				return pd, protowire.ParseError(n)
			}
			data = data[n:]
			var err error
			switch num {
			case 1:
				pd.Protocol, err = copyString(v)
			case 2:
				pd.PrefillAgent, err = copyString(v)
			case 3:
				pd.BootstrapHost, err = copyString(v)
			case 6:
				pd.KvTransferParamsJson = nil // as proto.Unmarshal leaves an empty proto3 bytes field
				if len(v) > 0 {
					pd.KvTransferParamsJson = append([]byte(nil), v...)
				}
			}
			if err != nil {
				return pd, err
			}
		default:
			return pd, errFallback
		}
	}
	return pd, nil
}

// decodeTraceEntry decodes one entry of a map<string, string> into m, as
// proto.Unmarshal does: key 1 and value 2, each the empty string when
// absent, the last of each when repeated; anything else in the entry,
// unknown numbers and other wire types alike, is skipped; a later entry
// with the same key replaces an earlier one.
func decodeTraceEntry(data []byte, m map[string]string) error {
	var key, val []byte
	for len(data) > 0 {
		num, typ, n := consumeTag(data)
		if n < 0 {
			return protowire.ParseError(n)
		}
		data = data[n:]
		if typ == protowire.BytesType && (num == 1 || num == 2) {
			v, n := protowire.ConsumeBytes(data)
			if n < 0 {
				return protowire.ParseError(n)
			}
			data = data[n:]
			if !utf8.Valid(v) {
				return errInvalidUTF8
			}
			if num == 1 {
				key = v
			} else {
				val = v
			}
			continue
		}
		n = protowire.ConsumeFieldValue(num, typ, data)
		if n < 0 {
			return protowire.ParseError(n)
		}
		data = data[n:]
	}
	m[string(key)] = string(val)
	return nil
}

// copyString returns b as a new string, refusing one that is not UTF-8 as
// proto.Unmarshal does.
func copyString(b []byte) (string, error) {
	if !utf8.Valid(b) {
		return "", errInvalidUTF8
	}
	return string(b), nil
}
