package wire

import (
	"errors"
	"strings"
	"testing"
	"time"
	"unsafe"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// chatBody is an OpenAI chat request of about 1 kB, as a broker validates
// and forwards it.
func chatBody() []byte {
	prompt := strings.Repeat("Summarise the following paragraph in one sentence. ", 18)
	return []byte(`{"model":"meta-llama/Llama-3.1-8B-Instruct","messages":[{"role":"system","content":"You are a helpful assistant."},{"role":"user","content":"` +
		prompt + `"}],"max_tokens":1,"stream":true,"stream_options":{"include_usage":true}}`)
}

// regularJob is the typical job of a regular pool.
func regularJob() *Job {
	return &Job{
		RequestId:       "b1-01JH8Z3Q4M5N6P7R8S9T0V1W2X",
		Model:           "meta-llama/Llama-3.1-8B-Instruct",
		Api:             API_API_CHAT,
		Stream:          true,
		Body:            chatBody(),
		ReplySubject:    "sy.reply.b1",
		Deadline:        timestamppb.New(time.Date(2026, 12, 2, 10, 0, 30, 123456789, time.UTC)),
		Trace:           map[string]string{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"},
		ClientRequestId: "req-7f3a9c",
		BrokerId:        "b1",
		Secret:          0x9e3779b97f4a7c15,
	}
}

func typicalJobs() []struct {
	name string
	job  *Job
} {
	at := time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)
	pd := regularJob()
	pd.Pd = &PDHandoff{Protocol: "vllm", PrefillAgent: "p1", KvTransferParamsJson: []byte(`{"remote_block_ids":[1,2,3]}`)}
	pd.PdPair = "vllm|zone=a"
	pd.HandoffExpires = timestamppb.New(at.Add(30 * time.Second))
	pd.Attempt = 1
	sglang := regularJob()
	sglang.Pd = &PDHandoff{Protocol: "sglang", BootstrapHost: "10.0.0.7", BootstrapPort: 8998, BootstrapRoom: 1<<63 + 5}
	sglang.Release = true
	cont := regularJob()
	cont.Attempt = 2
	cont.Continuation = &Continuation{Text: "Once upon a tíme", CompletionTokens: 5}
	trace := regularJob()
	trace.Trace = map[string]string{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "tracestate": "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE", "": ""}
	return []struct {
		name string
		job  *Job
	}{
		{"empty", &Job{}},
		{"regular", regularJob()},
		{"minimal", &Job{RequestId: "b1-1", Model: "m", Body: []byte(`{}`), ReplySubject: "sy.reply.b1"}},
		{"deadline", &Job{RequestId: "b1-2", Deadline: timestamppb.New(at)}},
		{"deadline before 1970", &Job{Deadline: &timestamppb.Timestamp{Seconds: -62135596800, Nanos: -1}}},
		{"empty deadline", &Job{Deadline: &timestamppb.Timestamp{}}},
		{"trace", trace},
		{"pd vllm", pd},
		{"pd sglang", sglang},
		{"continuation", cont},
		{"embeddings", &Job{RequestId: "b1-3", Api: API_API_EMBEDDINGS, Body: []byte(`{"input":"x"}`), Attempt: ^uint32(0)}},
		{"negative api", &Job{Api: API(-7)}},
		{"handoff expires", &Job{HandoffExpires: timestamppb.New(at), PdPair: "sglang|", Release: true}},
	}
}

// alias reports whether b lies within data.
func alias(b, data []byte) bool {
	if len(b) == 0 || len(data) == 0 {
		return false
	}
	p, start := uintptr(unsafe.Pointer(&b[0])), uintptr(unsafe.Pointer(&data[0]))
	return p >= start && p < start+uintptr(len(data))
}

// dirtyJob is a job to decode into: DecodeJob must leave nothing of it.
func dirtyJob() *Job {
	j := regularJob()
	j.Pd = &PDHandoff{Protocol: "old"}
	j.Continuation = &Continuation{Text: "old"}
	j.HandoffExpires = timestamppb.Now()
	j.PdPair = "old"
	j.Release = true
	j.Attempt = 9
	j.Trace["old"] = "old"
	return j
}

// checkDecodeJob decodes data with DecodeJob, into a new and into a dirty
// job, and with proto.Unmarshal, and fails unless they agree.
func checkDecodeJob(t *testing.T, data []byte) {
	t.Helper()
	want := new(Job)
	perr := proto.Unmarshal(data, want)
	for _, got := range []*Job{new(Job), dirtyJob()} {
		err := DecodeJob(data, got)
		if (err == nil) != (perr == nil) {
			t.Fatalf("DecodeJob: %v; proto.Unmarshal: %v", err, perr)
		}
		if err != nil {
			continue
		}
		if !proto.Equal(got, want) {
			t.Fatalf("DecodeJob: %v\nproto.Unmarshal: %v", got, want)
		}
		if body := got.GetBody(); alias(body, data) && cap(body) != len(body) {
			t.Fatalf("body has spare capacity %d: an append would write into the message", cap(body)-len(body))
		}
		if got.GetBody() == nil && want.GetBody() != nil || got.GetBody() != nil && want.GetBody() == nil {
			t.Fatalf("body %v, proto.Unmarshal's %v", got.GetBody(), want.GetBody())
		}
		// The strings are copies: keeping one must not keep data.
		for _, s := range []string{got.GetRequestId(), got.GetModel(), got.GetReplySubject(), got.GetClientRequestId(), got.GetBrokerId(), got.GetPdPair()} {
			if alias(unsafe.Slice(unsafe.StringData(s), len(s)), data) {
				t.Fatalf("string %q aliases the data", s)
			}
		}
	}
}

func TestDecodeJob(t *testing.T) {
	for _, tc := range typicalJobs() {
		t.Run(tc.name, func(t *testing.T) {
			data, err := proto.Marshal(tc.job)
			if err != nil {
				t.Fatal(err)
			}
			checkDecodeJob(t, data)
			got := dirtyJob()
			if err := DecodeJob(data, got); err != nil {
				t.Fatal(err)
			}
			if !proto.Equal(got, tc.job) {
				t.Fatalf("got %v, want %v", got, tc.job)
			}
			// The body of a job decoded here (not by the fallback, which
			// only a continuation takes of these) is the message's own
			// bytes: no copy of the prompt. PD jobs are decoded here too.
			if tc.job.GetContinuation() == nil && len(tc.job.GetBody()) > 0 && !alias(got.GetBody(), data) {
				t.Fatal("body copied")
			}
		})
	}
}

// Encodings proto.Marshal does not produce, but a decoder must take as
// proto.Unmarshal does.
func TestDecodeJobOddEncodings(t *testing.T) {
	str := func(b []byte, num protowire.Number, s string) []byte {
		b = protowire.AppendTag(b, num, protowire.BytesType)
		return protowire.AppendString(b, s)
	}
	msg := func(b []byte, num protowire.Number, m []byte) []byte {
		b = protowire.AppendTag(b, num, protowire.BytesType)
		return protowire.AppendBytes(b, m)
	}
	varint := func(b []byte, num protowire.Number, v uint64) []byte {
		b = protowire.AppendTag(b, num, protowire.VarintType)
		return protowire.AppendVarint(b, v)
	}
	regular, _ := proto.Marshal(regularJob())
	for _, tc := range []struct {
		name string
		data []byte
	}{
		{"repeated scalars", varint(str(varint(str(regular, 1, "b1-other"), 2, 7), 3, "m2"), 2, 8)},
		{"repeated body", str(regular, 6, "{}")},
		{"empty body last", str(regular, 6, "")},
		{"deadline merged", msg(regular, 8, varint(nil, 2, 5))},
		{"deadline twice, seconds", msg(msg(nil, 8, varint(varint(nil, 1, 100), 2, 7)), 8, varint(nil, 1, 200))},
		{"deadline nanos out of int32", msg(nil, 8, varint(nil, 2, 1<<40|3))},
		{"deadline seconds negative", msg(nil, 8, varint(nil, 1, ^uint64(0)))},
		{"deadline with an unknown field", msg(nil, 8, str(varint(nil, 1, 100), 3, "x"))},
		{"deadline seconds as bytes", msg(nil, 8, str(nil, 1, "x"))},
		{"handoff merged", msg(msg(nil, 15, varint(nil, 1, 100)), 15, varint(nil, 2, 9))},
		{"trace duplicate key", msg(msg(nil, 9, str(str(nil, 1, "k"), 2, "v1")), 9, str(str(nil, 1, "k"), 2, "v2"))},
		{"trace no key", msg(nil, 9, str(nil, 2, "v"))},
		{"trace no value", msg(nil, 9, str(nil, 1, "k"))},
		{"trace empty entry", msg(nil, 9, nil)},
		{"trace value first", msg(nil, 9, str(str(nil, 2, "v"), 1, "k"))},
		{"trace repeated key in entry", msg(nil, 9, str(str(str(nil, 1, "a"), 2, "v"), 1, "b"))},
		{"trace unknown in entry", msg(nil, 9, varint(str(str(str(nil, 1, "k"), 3, "junk"), 2, "v"), 7, 1))},
		{"trace key as varint", msg(nil, 9, str(varint(nil, 1, 5), 2, "v"))},
		{"trace group in entry", msg(nil, 9, append(str(nil, 1, "k"), 0x1b, 0x08, 0x01, 0x1c))},
		{"unknown field", varint(regular, 99, 1)},
		{"unknown field first", append(varint(nil, 18, 1), regular...)},
		{"attempt as bytes", str(regular, 2, "x")},
		{"request id as varint", varint(regular, 1, 3)},
		{"secret as varint", varint(regular, 16, 3)},
		{"fixed32", protowire.AppendFixed32(protowire.AppendTag(regular, 16, protowire.Fixed32Type), 1)},
		{"group", append(regular, 0x1b, 0x08, 0x01, 0x1c)},
		{"pd twice", msg(msg(regular, 12, str(nil, 1, "vllm")), 12, str(nil, 2, "p1"))},
		{"continuation", msg(regular, 13, varint(nil, 2, 3))},
		{"bool 2", varint(varint(nil, 5, 2), 17, 1<<40)},
		{"long varint", append(protowire.AppendTag(nil, 2, protowire.VarintType), 0x81, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x00)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			checkDecodeJob(t, tc.data)
		})
	}
}

func TestDecodeJobRefuses(t *testing.T) {
	regular, _ := proto.Marshal(regularJob())
	// badUTF8 marshals j and makes its one DEL byte invalid UTF-8, which
	// proto.Marshal would refuse to write.
	badUTF8 := func(j *Job) []byte {
		data, err := proto.Marshal(j)
		if err != nil {
			t.Fatal(err)
		}
		data[strings.IndexByte(string(data), 0x7f)] = 0xff
		return data
	}
	for _, tc := range []struct {
		name string
		data []byte
	}{
		{"truncated", regular[:len(regular)-2]},
		{"truncated in the body", regular[:200]},
		{"truncated tag", append(regular[:len(regular):len(regular)], 0x80)},
		{"invalid UTF-8", badUTF8(&Job{RequestId: "b1-\x7f"})},
		{"invalid UTF-8 in the reply subject", badUTF8(&Job{RequestId: "b1-1", ReplySubject: "sy.\x7f"})},
		{"invalid UTF-8 in a trace key", badUTF8(&Job{Trace: map[string]string{"a\x7f": "v"}})},
		{"invalid UTF-8 in a trace value", badUTF8(&Job{Trace: map[string]string{"k": "\x7f"}})},
		{"invalid UTF-8 in a continuation", badUTF8(&Job{Continuation: &Continuation{Text: "\x7f"}})},
		{"field number 0", []byte{0x02, 0x00}},
		{"end group alone", []byte{0x0c}},
		{"varint too long", []byte{0x10, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02}},
		{"truncated deadline", []byte{0x42, 0x02, 0x08, 0x80}},
		{"truncated trace entry", []byte{0x4a, 0x03, 0x0a, 0x05, 0x61}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if proto.Unmarshal(tc.data, new(Job)) == nil {
				t.Fatal("proto.Unmarshal accepts it: not a case to refuse")
			}
			if err := DecodeJob(tc.data, dirtyJob()); err == nil {
				t.Fatal("accepted")
			}
		})
	}
	// Every cut of a job that proto.Unmarshal refuses is refused.
	for _, tc := range typicalJobs() {
		data, _ := proto.Marshal(tc.job)
		for i := range data {
			checkDecodeJob(t, data[:i])
		}
	}
	if err := DecodeJob(badUTF8(&Job{Model: "\x7f"}), new(Job)); !errors.Is(err, errInvalidUTF8) {
		t.Fatalf("invalid UTF-8: %v", err)
	}
}

func FuzzDecodeJob(f *testing.F) {
	for _, tc := range typicalJobs() {
		data, err := proto.Marshal(tc.job)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		checkDecodeJob(t, data)
	})
}

// The agent's decode of a typical job, against proto.Unmarshal.
func BenchmarkDecodeJob(b *testing.B) {
	data, err := proto.Marshal(regularJob())
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.SetBytes(int64(len(data)))
	for b.Loop() {
		if err := DecodeJob(data, new(Job)); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkUnmarshalJob(b *testing.B) {
	data, err := proto.Marshal(regularJob())
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.SetBytes(int64(len(data)))
	for b.Loop() {
		if err := proto.Unmarshal(data, new(Job)); err != nil {
			b.Fatal(err)
		}
	}
}
