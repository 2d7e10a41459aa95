package wire

import (
	"math"
	"strconv"
	"time"
	"unicode/utf8"

	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// decodeHeartbeat is UnmarshalHeartbeat's fast path: every broker decodes
// every heartbeat of the fleet, and protojson's reflection-driven decoder
// is most of that cost. It reads the JSON that MarshalHeartbeat writes (an
// object of proto field names, plain numbers, strings without escapes,
// RFC 3339 timestamps, durations in seconds) straight into hb, skipping
// unknown fields with scalar values as protojson does with DiscardUnknown.
//
// It reports false for anything outside that form (escapes, lowerCamel
// names, numbers as strings, NaN, nested unknown values, a duplicate, a
// syntax error): the caller then decodes data with protojson, which
// decides. So the pair decodes every input exactly as protojson alone
// does (FuzzUnmarshalHeartbeat checks it). On false hb holds part of data.
func decodeHeartbeat(data []byte, hb *Heartbeat) bool {
	d := hbDecoder{b: data}
	if !d.byte('{') {
		return false
	}
	var seen uint64
	if d.peek() == '}' {
		d.i++
		return d.end()
	}
	for {
		key, ok := d.str()
		if !ok || !d.byte(':') {
			return false
		}
		num := heartbeatField(key)
		if num == 0 {
			if knownHeartbeatName(key) || (len(key) > 0 && key[0] == '[') {
				return false // a lowerCamel name, or an extension's
			}
			if !d.skipScalar() {
				return false
			}
		} else {
			if seen&(1<<num) != 0 {
				return false // protojson refuses duplicates
			}
			seen |= 1 << num
			if !d.field(hb, num) {
				return false
			}
		}
		switch d.next() {
		case ',':
		case '}':
			return d.end()
		default:
			return false
		}
	}
}

// heartbeatField maps a proto field name to its number; 0 for any other
// name.
func heartbeatField(key []byte) protoreflect.FieldNumber {
	switch string(key) {
	case "agent_id":
		return 1
	case "model":
		return 2
	case "pool":
		return 3
	case "engine":
		return 4
	case "transport":
		return 5
	case "state":
		return 6
	case "slots":
		return 7
	case "active":
		return 8
	case "engine_running":
		return 9
	case "engine_waiting":
		return 10
	case "kv_cache_usage":
		return 11
	case "ready_since":
		return 12
	case "interval":
		return 13
	case "seq":
		return 14
	case "version":
		return 15
	case "sent_at":
		return 16
	case "pd_protocol":
		return 17
	case "bootstrap_host":
		return 18
	case "bootstrap_port":
		return 19
	case "state_reason":
		return 20
	case "pd_labels":
		return 21
	case "pull_limit":
		return 22
	case "prefix_cache_queries":
		return 23
	case "prefix_cache_hits":
		return 24
	case "kv_events":
		return 25
	case "batch_active":
		return 26
	}
	return 0
}

// knownHeartbeatName reports whether protojson reads key as a field of
// Heartbeat (by its JSON or its proto name).
func knownHeartbeatName(key []byte) bool {
	fds := (&Heartbeat{}).ProtoReflect().Descriptor().Fields()
	return fds.ByJSONName(string(key)) != nil || fds.ByTextName(string(key)) != nil
}

// field decodes the value of field num into hb.
func (d *hbDecoder) field(hb *Heartbeat, num protoreflect.FieldNumber) bool {
	if d.null() {
		return true // protojson leaves a field that is null unset
	}
	switch num {
	case 1, 2, 3, 4, 5, 6, 15, 17, 18, 20, 21:
		s, ok := d.str()
		if !ok {
			return false
		}
		v := string(s)
		switch num {
		case 1:
			hb.AgentId = v
		case 2:
			hb.Model = v
		case 3:
			hb.Pool = v
		case 4:
			hb.Engine = v
		case 5:
			hb.Transport = v
		case 6:
			hb.State = v
		case 15:
			hb.Version = v
		case 17:
			hb.PdProtocol = v
		case 18:
			hb.BootstrapHost = v
		case 20:
			hb.StateReason = v
		case 21:
			hb.PdLabels = v
		}
	case 7, 8, 9, 10, 14, 19, 22, 26:
		v, ok := d.uint32()
		if !ok {
			return false
		}
		switch num {
		case 7:
			hb.Slots = v
		case 8:
			hb.Active = v
		case 9:
			hb.EngineRunning = &v
		case 10:
			hb.EngineWaiting = &v
		case 14:
			hb.Seq = v
		case 19:
			hb.BootstrapPort = v
		case 22:
			hb.PullLimit = v
		case 26:
			hb.BatchActive = v
		}
	case 11, 23, 24:
		v, ok := d.float()
		if !ok {
			return false
		}
		switch num {
		case 11:
			hb.KvCacheUsage = &v
		case 23:
			hb.PrefixCacheQueries = &v
		case 24:
			hb.PrefixCacheHits = &v
		}
	case 12, 16:
		s, ok := d.str()
		if !ok {
			return false
		}
		ts, ok := parseTimestamp(s)
		if !ok {
			return false
		}
		if num == 12 {
			hb.ReadySince = ts
		} else {
			hb.SentAt = ts
		}
	case 13:
		s, ok := d.str()
		if !ok {
			return false
		}
		du, ok := parseDuration(s)
		if !ok {
			return false
		}
		hb.Interval = du
	case 25:
		v, ok := d.bool()
		if !ok {
			return false
		}
		hb.KvEvents = v
	default:
		return false
	}
	return true
}

// The range of a Timestamp and a Duration in protojson.
const (
	minTimestampSeconds  = -62135596800 // 0001-01-01T00:00:00Z
	maxTimestampSeconds  = 253402300799 // 9999-12-31T23:59:59Z
	maxSecondsInDuration = 315576000000
)

// parseTimestamp reads a Timestamp as protojson does: RFC 3339, within its
// range, at most nine fractional digits.
func parseTimestamp(s []byte) (*timestamppb.Timestamp, bool) {
	t, err := time.Parse(time.RFC3339Nano, string(s))
	if err != nil {
		return nil, false
	}
	secs := t.Unix()
	if secs < minTimestampSeconds || secs > maxTimestampSeconds {
		return nil, false
	}
	frac, zone := -1, -1
	for i, c := range s {
		switch c {
		case '.':
			frac = i
		case 'Z', '-', '+':
			zone = i
		}
	}
	if frac >= 0 && zone >= frac && zone-frac > len(".999999999") {
		return nil, false
	}
	return &timestamppb.Timestamp{Seconds: secs, Nanos: int32(t.Nanosecond())}, true
}

// parseDuration reads the form MarshalHeartbeat writes, an optional minus,
// integer seconds without leading zeros and up to nine fractional digits,
// then "s"; protojson reads other forms (a plus, ".5s").
func parseDuration(s []byte) (*durationpb.Duration, bool) {
	if len(s) < 2 || s[len(s)-1] != 's' {
		return nil, false
	}
	s = s[:len(s)-1]
	neg := s[0] == '-'
	if neg {
		s = s[1:]
	}
	i := 0
	for i < len(s) && isDigit(s[i]) {
		i++
	}
	if i == 0 || i > 12 || (s[0] == '0' && i > 1) {
		return nil, false
	}
	var secs int64
	for _, c := range s[:i] {
		secs = secs*10 + int64(c-'0')
	}
	var nanos int64
	if i < len(s) {
		if s[i] != '.' {
			return nil, false
		}
		f := s[i+1:]
		if len(f) == 0 || len(f) > 9 {
			return nil, false
		}
		for _, c := range f {
			if !isDigit(c) {
				return nil, false
			}
			nanos = nanos*10 + int64(c-'0')
		}
		for range 9 - len(f) {
			nanos *= 10
		}
	}
	if secs > maxSecondsInDuration {
		return nil, false
	}
	if neg {
		secs, nanos = -secs, -nanos
	}
	return &durationpb.Duration{Seconds: secs, Nanos: int32(nanos)}, true
}

// hbDecoder scans one JSON object.
type hbDecoder struct {
	b []byte
	i int
}

func (d *hbDecoder) skipSpace() {
	for d.i < len(d.b) {
		switch d.b[d.i] {
		case ' ', '\t', '\n', '\r':
			d.i++
		default:
			return
		}
	}
}

// peek returns the next byte after white space; 0 at the end.
func (d *hbDecoder) peek() byte {
	d.skipSpace()
	if d.i < len(d.b) {
		return d.b[d.i]
	}
	return 0
}

// next consumes and returns the next byte after white space.
func (d *hbDecoder) next() byte {
	c := d.peek()
	if c != 0 {
		d.i++
	}
	return c
}

func (d *hbDecoder) byte(c byte) bool { return d.next() == c }

// end reports whether only white space is left.
func (d *hbDecoder) end() bool {
	d.skipSpace()
	return d.i == len(d.b)
}

// str reads a string without escapes and returns its bytes (aliasing
// data); it refuses escapes, control bytes and invalid UTF-8.
func (d *hbDecoder) str() ([]byte, bool) {
	if !d.byte('"') {
		return nil, false
	}
	start := d.i
	ascii := true
	for d.i < len(d.b) {
		c := d.b[d.i]
		switch {
		case c == '"':
			s := d.b[start:d.i]
			d.i++
			if !ascii && !utf8.Valid(s) {
				return nil, false
			}
			return s, true
		case c == '\\' || c < 0x20:
			return nil, false
		case c >= utf8.RuneSelf:
			ascii = false
		}
		d.i++
	}
	return nil, false
}

// literal consumes word if it comes next.
func (d *hbDecoder) literal(word string) bool {
	if d.peek() != word[0] || len(d.b)-d.i < len(word) || string(d.b[d.i:d.i+len(word)]) != word {
		return false
	}
	d.i += len(word)
	return true
}

func (d *hbDecoder) null() bool { return d.literal("null") }

func (d *hbDecoder) bool() (bool, bool) {
	switch {
	case d.literal("true"):
		return true, true
	case d.literal("false"):
		return false, true
	}
	return false, false
}

// number returns the bytes of a JSON number.
func (d *hbDecoder) number() ([]byte, bool) {
	d.skipSpace()
	start := d.i
	if d.i < len(d.b) && d.b[d.i] == '-' {
		d.i++
	}
	digits := d.digits()
	if digits == 0 || (digits > 1 && d.b[d.i-digits] == '0') {
		return nil, false
	}
	if d.i < len(d.b) && d.b[d.i] == '.' {
		d.i++
		if d.digits() == 0 {
			return nil, false
		}
	}
	if d.i < len(d.b) && (d.b[d.i] == 'e' || d.b[d.i] == 'E') {
		d.i++
		if d.i < len(d.b) && (d.b[d.i] == '+' || d.b[d.i] == '-') {
			d.i++
		}
		if d.digits() == 0 {
			return nil, false
		}
	}
	return d.b[start:d.i], true
}

func (d *hbDecoder) digits() int {
	n := 0
	for d.i < len(d.b) && isDigit(d.b[d.i]) {
		d.i++
		n++
	}
	return n
}

func isDigit(c byte) bool { return '0' <= c && c <= '9' }

// uint32 reads a plain non-negative integer (digits only) that fits.
func (d *hbDecoder) uint32() (uint32, bool) {
	d.skipSpace()
	start := d.i
	n := d.digits()
	if n == 0 || n > 10 || (n > 1 && d.b[start] == '0') {
		return 0, false
	}
	if d.i < len(d.b) {
		switch d.b[d.i] {
		case '.', 'e', 'E':
			return 0, false
		}
	}
	var v uint64
	for _, c := range d.b[start:d.i] {
		v = v*10 + uint64(c-'0')
	}
	return uint32(v), v <= math.MaxUint32
}

func (d *hbDecoder) float() (float64, bool) {
	num, ok := d.number()
	if !ok {
		return 0, false
	}
	v, err := strconv.ParseFloat(string(num), 64)
	if err != nil || math.IsInf(v, 0) {
		return 0, false
	}
	return v, true
}

// skipScalar skips an unknown field's value: a string, number, true, false
// or null. Objects and arrays are left to protojson.
func (d *hbDecoder) skipScalar() bool {
	switch d.peek() {
	case '"':
		_, ok := d.str()
		return ok
	case 't', 'f':
		_, ok := d.bool()
		return ok
	case 'n':
		return d.null()
	}
	_, ok := d.number()
	return ok
}
