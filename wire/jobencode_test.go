package wire

import (
	"bytes"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"
)

func encodeJobs() []*Job {
	dl := timestamppb.New(time.Unix(1764766000, 123456789))
	return []*Job{
		{},
		{RequestId: "b1-1abc", Attempt: 2, Model: "llama", Api: API_API_CHAT, Stream: true,
			Body: []byte(`{"model":"llama","messages":[{"role":"user","content":"hi"}]}`), ReplySubject: "sy.reply.b1",
			Deadline: dl, Trace: map[string]string{"traceparent": "00-abc-def-01", "tracestate": "a=1", "": "", "z": ""},
			ClientRequestId: "c-1", BrokerId: "b1", PdPair: "vllm", Secret: 0xdeadbeefcafef00d},
		{RequestId: "r", Pd: &PDHandoff{}},
		{RequestId: "r", Pd: &PDHandoff{Protocol: "sglang", PrefillAgent: "p1", BootstrapHost: "10.0.0.1", BootstrapPort: 8998,
			BootstrapRoom: ^uint64(0), KvTransferParamsJson: []byte(`{"remote_block_ids":[1,2]}`)},
			HandoffExpires: &timestamppb.Timestamp{}, Release: true},
		{RequestId: "r", Continuation: &Continuation{}, Deadline: &timestamppb.Timestamp{Seconds: -5, Nanos: -1}},
		{RequestId: "r", Continuation: &Continuation{Text: "Once upon", CompletionTokens: 3}, Api: API(-1), Attempt: ^uint32(0)},
	}
}

// TestAppendJob: the bytes of proto.Marshal with sorted map entries,
// including what it leaves to it (unknown fields), after any prefix.
func TestAppendJob(t *testing.T) {
	withUnknown := &Job{RequestId: "r"}
	withUnknown.ProtoReflect().SetUnknown([]byte{0xf8, 0x01, 0x01}) // field 31, varint 1
	unknownPD := &Job{Pd: &PDHandoff{Protocol: "vllm"}}
	unknownPD.Pd.ProtoReflect().SetUnknown([]byte{0xf8, 0x01, 0x01})
	for i, j := range append(encodeJobs(), withUnknown, unknownPD) {
		want, err := proto.MarshalOptions{Deterministic: true}.Marshal(j)
		if err != nil {
			t.Fatal(err)
		}
		got, err := AppendJob([]byte("prefix"), j)
		if err != nil {
			t.Fatalf("job %d: %v", i, err)
		}
		if !bytes.Equal(got[len("prefix"):], want) || !bytes.HasPrefix(got, []byte("prefix")) {
			t.Fatalf("job %d: AppendJob = %x, proto.Marshal = %x", i, got, want)
		}
	}
}

// TestAppendJobInvalidUTF8: a string that is not UTF-8 is refused, as
// proto.Marshal refuses it, wherever it is.
func TestAppendJobInvalidUTF8(t *testing.T) {
	bad := string([]byte{0xff, 'x'})
	for _, j := range []*Job{
		{RequestId: bad}, {Model: bad}, {ReplySubject: bad}, {ClientRequestId: bad}, {BrokerId: bad}, {PdPair: bad},
		{Trace: map[string]string{bad: "v"}}, {Trace: map[string]string{"k": bad}},
		{Pd: &PDHandoff{Protocol: bad}}, {Pd: &PDHandoff{PrefillAgent: bad}}, {Pd: &PDHandoff{BootstrapHost: bad}},
		{Continuation: &Continuation{Text: bad}},
	} {
		if _, err := proto.Marshal(j); err == nil {
			t.Fatalf("proto.Marshal took %v", j)
		}
		if _, err := AppendJob(nil, j); err == nil {
			t.Fatalf("AppendJob took %v", j)
		}
	}
	if _, err := AppendJob(nil, &Job{Body: []byte{0xff}, Pd: &PDHandoff{KvTransferParamsJson: []byte{0xfe}}}); err != nil {
		t.Fatalf("bytes need not be UTF-8: %v", err)
	}
}

func FuzzAppendJob(f *testing.F) {
	f.Add("b1-1abc", uint32(1), "m", int32(1), []byte(`{"x":1}`), "sy.reply.b1", int64(1764766000), int32(5), "traceparent", "00-1",
		"sglang", uint32(8998), uint64(7), "text", uint64(9), uint8(0xff))
	f.Add("", uint32(0), "", int32(0), []byte(nil), "", int64(0), int32(0), "", "", "", uint32(0), uint64(0), "", uint64(0), uint8(0))
	f.Fuzz(func(t *testing.T, id string, attempt uint32, model string, api int32, body []byte, reply string, secs int64, nanos int32,
		tk, tv, proto1 string, port uint32, room uint64, text string, secret uint64, set uint8) {
		j := &Job{RequestId: id, Attempt: attempt, Model: model, Api: API(api), Stream: set&1 != 0, Body: body, ReplySubject: reply,
			ClientRequestId: tv, BrokerId: tk, PdPair: proto1, Secret: secret, Release: set&2 != 0}
		if set&4 != 0 {
			j.Deadline = &timestamppb.Timestamp{Seconds: secs, Nanos: nanos}
		}
		if set&8 != 0 {
			j.Trace = map[string]string{tk: tv, tv: tk, "traceparent": tv}
		}
		if set&16 != 0 {
			j.Pd = &PDHandoff{Protocol: proto1, PrefillAgent: tk, BootstrapHost: tv, BootstrapPort: port, BootstrapRoom: room, KvTransferParamsJson: body}
		}
		if set&32 != 0 {
			j.Continuation = &Continuation{Text: text, CompletionTokens: port}
		}
		if set&64 != 0 {
			j.HandoffExpires = &timestamppb.Timestamp{Seconds: -secs, Nanos: -nanos}
		}
		want, werr := proto.MarshalOptions{Deterministic: true}.Marshal(j)
		got, gerr := AppendJob(nil, j)
		if (werr == nil) != (gerr == nil) {
			t.Fatalf("proto.Marshal error %v, AppendJob error %v", werr, gerr)
		}
		if werr == nil && !bytes.Equal(got, want) {
			t.Fatalf("AppendJob = %x, proto.Marshal = %x", got, want)
		}
	})
}

func BenchmarkEncodeJob(b *testing.B) {
	j := encodeJobs()[1]
	b.Run("AppendJob", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := AppendJob(nil, j); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("proto.Marshal", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := proto.Marshal(j); err != nil {
				b.Fatal(err)
			}
		}
	})
}
