package kvevents

import (
	"bytes"
	"encoding/hex"
	"errors"
	"reflect"
	"testing"
	"time"

	"github.com/vmihailenco/msgpack/v5"
)

// vllmPayload is what vLLM (msgspec) writes for
// KVEventBatch(ts=1.5, events=[BlockStored([1, 2**64-1], None, [3, 4], 2, None, "GPU"),
// BlockRemoved([7], "GPU"), AllBlocksCleared()]), written out by hand.
const vllmPayload = "92" + // array of 2: ts, events (no data_parallel_rank)
	"cb3ff8000000000000" + // 1.5
	"93" + // 3 events
	"97" + "ab426c6f636b53746f726564" + // ["BlockStored",
	"9201cfffffffffffffffff" + // [1, 2**64-1],
	"c0" + "920304" + "02" + "c0" + "a3475055" + // None, [3, 4], 2, None, "GPU"]
	"93" + "ac426c6f636b52656d6f766564" + "9107" + "a3475055" + // ["BlockRemoved", [7], "GPU"]
	"91" + "b0416c6c426c6f636b73436c6561726564" // ["AllBlocksCleared"]

func wantBatch() Batch {
	return Batch{
		Time: time.Unix(1, 5e8),
		Events: []Event{
			{Kind: BlockStored, Hashes: []uint64{1, 1<<64 - 1}, TokenIDs: []uint32{3, 4}, BlockSize: 2, Medium: "GPU"},
			{Kind: BlockRemoved, Hashes: []uint64{7}, Medium: "GPU"},
			{Kind: AllBlocksCleared},
		},
		DataParallelRank: -1,
	}
}

func TestDecodeVLLMPayload(t *testing.T) {
	raw, _ := hex.DecodeString(vllmPayload)
	b, err := Decode(raw)
	if err != nil {
		t.Fatal(err)
	}
	if want := wantBatch(); !reflect.DeepEqual(b, want) {
		t.Errorf("Decode =\n%+v, want\n%+v", b, want)
	}
}

func TestEncodeIsVLLMPayload(t *testing.T) {
	if got := hex.EncodeToString(Encode(wantBatch())); got != vllmPayload {
		t.Errorf("Encode =\n%s, want\n%s", got, vllmPayload)
	}
}

func TestRoundTrip(t *testing.T) {
	b := Batch{
		Time: time.Unix(1_750_000_000, 250_000_000),
		Events: []Event{
			{Kind: BlockStored, Hashes: []uint64{10, 11}, Parent: 9, HasParent: true,
				TokenIDs: []uint32{1, 2, 3, 4}, BlockSize: 2, LoraID: 3, Medium: "CPU"},
		},
		DataParallelRank: 2,
	}
	got, err := Decode(Encode(b))
	if err != nil {
		t.Fatal(err)
	}
	if got.Time.Sub(b.Time).Abs() > time.Microsecond {
		t.Errorf("time %v, want %v", got.Time, b.Time)
	}
	got.Time = b.Time
	if !reflect.DeepEqual(got, b) {
		t.Errorf("round trip =\n%+v, want\n%+v", got, b)
	}
}

// encodeAny writes v as msgpack, for payloads in other shapes than
// Encode's.
func encodeAny(t *testing.T, v any) []byte {
	t.Helper()
	var buf bytes.Buffer
	enc := msgpack.NewEncoder(&buf)
	if err := enc.Encode(v); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func TestDecodeVariants(t *testing.T) {
	hash32 := make([]byte, 32)
	hash32[31], hash32[24] = 0x2a, 0x01
	tests := []struct {
		name    string
		payload []any
		want    []Event
		rank    int
	}{
		{
			name:    "bytes hashes are their last 8 bytes",
			payload: []any{1.0, []any{[]any{"BlockStored", []any{hash32}, hash32, []any{1}, 1, nil, "GPU"}}},
			want:    []Event{{Kind: BlockStored, Hashes: []uint64{1<<56 | 42}, Parent: 1<<56 | 42, HasParent: true, TokenIDs: []uint32{1}, BlockSize: 1, Medium: "GPU"}},
			rank:    -1,
		},
		{
			name:    "older event without medium, data parallel rank",
			payload: []any{1.0, []any{[]any{"BlockStored", []any{5}, 4, []any{}, 16, 2}}, 3},
			want:    []Event{{Kind: BlockStored, Hashes: []uint64{5}, Parent: 4, HasParent: true, TokenIDs: []uint32{}, BlockSize: 16, LoraID: 2}},
			rank:    3,
		},
		{
			name:    "newer trailing fields skipped, negative hash",
			payload: []any{1.0, []any{[]any{"BlockRemoved", []any{-1}, "GPU", "extra", []any{1, 2}}}, nil},
			want:    []Event{{Kind: BlockRemoved, Hashes: []uint64{1<<64 - 1}, Medium: "GPU"}},
			rank:    -1,
		},
		{
			name:    "unknown event skipped",
			payload: []any{1.0, []any{[]any{"BlockMoved", 1, 2}, []any{"AllBlocksCleared"}}},
			want:    []Event{{Kind: AllBlocksCleared}},
			rank:    -1,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, err := Decode(encodeAny(t, tt.payload))
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(b.Events, tt.want) || b.DataParallelRank != tt.rank {
				t.Errorf("Decode = %+v rank %d, want %+v rank %d", b.Events, b.DataParallelRank, tt.want, tt.rank)
			}
		})
	}
}

func TestDecodeErrors(t *testing.T) {
	tests := []struct {
		name    string
		payload []byte
	}{
		{name: "empty", payload: nil},
		{name: "not an array", payload: []byte{0x01}},
		{name: "one field", payload: []byte{0x91, 0x01}},
		{name: "truncated", payload: []byte{0x92, 0xcb, 0x3f}},
		{name: "event without tag", payload: []byte{0x92, 0x01, 0x91, 0x90}},
		{name: "stored without hashes", payload: []byte{0x92, 0x01, 0x91, 0x91, 0xab, 'B', 'l', 'o', 'c', 'k', 'S', 't', 'o', 'r', 'e', 'd'}},
		{name: "nil hash in list", payload: []byte{0x92, 0x01, 0x91, 0x92, 0xac, 'B', 'l', 'o', 'c', 'k', 'R', 'e', 'm', 'o', 'v', 'e', 'd', 0x91, 0xc0}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := Decode(tt.payload); !errors.Is(err, ErrFormat) {
				t.Errorf("Decode = %v, want ErrFormat", err)
			}
		})
	}
}

func FuzzDecode(f *testing.F) {
	raw, _ := hex.DecodeString(vllmPayload)
	f.Add(raw)
	f.Add(Encode(Batch{Time: time.Unix(5, 0), DataParallelRank: 1, Events: []Event{{Kind: BlockStored, Hashes: []uint64{1}, HasParent: true}}}))
	f.Fuzz(func(t *testing.T, payload []byte) {
		b, err := Decode(payload)
		if err != nil {
			return
		}
		// What decodes re-encodes to something that decodes the same.
		b2, err := Decode(Encode(b))
		if err != nil {
			t.Fatalf("re-decode: %v", err)
		}
		if len(b2.Events) != len(b.Events) {
			t.Fatalf("%d events, then %d", len(b.Events), len(b2.Events))
		}
	})
}

func TestSummarize(t *testing.T) {
	st := func(h ...uint64) Event { return Event{Kind: BlockStored, Hashes: h, Medium: "GPU"} }
	rm := func(h ...uint64) Event { return Event{Kind: BlockRemoved, Hashes: h} }
	tests := []struct {
		name   string
		events []Event
		want   Summary
	}{
		{name: "empty", want: Summary{}},
		{name: "stored chain in order", events: []Event{st(1, 2, 3)}, want: Summary{Stored: []uint64{1, 2, 3}}},
		{name: "stored then removed", events: []Event{st(1, 2), rm(2)}, want: Summary{Stored: []uint64{1}, Removed: []uint64{2}}},
		{name: "removed then stored", events: []Event{rm(5), st(5)}, want: Summary{Stored: []uint64{5}}},
		{name: "clear forgets before", events: []Event{st(1), {Kind: AllBlocksCleared}, st(2)}, want: Summary{Cleared: true, Stored: []uint64{2}}},
		{name: "cpu blocks left out", events: []Event{{Kind: BlockStored, Hashes: []uint64{9}, Medium: "CPU"}, st(1)}, want: Summary{Stored: []uint64{1}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Summarize(tt.events); !reflect.DeepEqual(got, tt.want) {
				t.Errorf("Summarize = %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestParseConfig(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		want    Config
		wantErr bool
	}{
		{name: "empty is off", in: "", want: Config{}},
		{name: "vLLM's example", in: `{"enable_kv_cache_events": true, "publisher": "zmq", "endpoint": "tcp://*:5557", "topic": "kv-events", "replay_endpoint": "tcp://*:5558", "buffer_steps": 10000}`,
			want: Config{Enabled: true, Publisher: "zmq", Endpoint: "tcp://*:5557", Topic: "kv-events"}},
		{name: "defaults", in: `{"enable_kv_cache_events": true}`, want: Config{Enabled: true, Publisher: "zmq", Endpoint: DefaultEndpoint}},
		{name: "unknown publisher", in: `{"enable_kv_cache_events": true, "publisher": "kafka"}`, wantErr: true},
		{name: "ipc endpoint", in: `{"enable_kv_cache_events": true, "endpoint": "ipc:///tmp/kv"}`, wantErr: true},
		{name: "not json", in: `{`, wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseConfig(tt.in)
			if tt.wantErr {
				if !errors.Is(err, ErrConfig) {
					t.Errorf("err = %v, want ErrConfig", err)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Errorf("ParseConfig = %+v, %v, want %+v", got, err, tt.want)
			}
		})
	}
}
