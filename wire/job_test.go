package wire

import (
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

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

// TestJobRoundTrip: every field of a job survives its encoding, as the
// broker writes it and an agent reads it (a decode job the other way).
func TestJobRoundTrip(t *testing.T) {
	for _, tc := range typicalJobs() {
		t.Run(tc.name, func(t *testing.T) {
			data, err := proto.Marshal(tc.job)
			if err != nil {
				t.Fatal(err)
			}
			got := new(Job)
			if err := proto.Unmarshal(data, got); err != nil {
				t.Fatal(err)
			}
			if !proto.Equal(got, tc.job) {
				t.Fatalf("got %v, want %v", got, tc.job)
			}
		})
	}
}

// TestJobGolden: the encodings under testdata/jobs, written by an earlier
// build (-update rewrites them), still decode to the same jobs, so a
// change of wire.proto that breaks a peer of another version (a field
// renumbered, its type changed) fails here. The bytes are compared after
// decoding, not as bytes: protobuf-go does not promise a stable encoding.
func TestJobGolden(t *testing.T) {
	for _, tc := range typicalJobs() {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join("testdata", "jobs", strings.ReplaceAll(tc.name, " ", "_")+".hex")
			if *update {
				data, err := proto.MarshalOptions{Deterministic: true}.Marshal(tc.job)
				if err != nil {
					t.Fatal(err)
				}
				if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(path, []byte(hex.EncodeToString(data)+"\n"), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			text, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			data, err := hex.DecodeString(strings.TrimSpace(string(text)))
			if err != nil {
				t.Fatal(err)
			}
			got := new(Job)
			if err := proto.Unmarshal(data, got); err != nil {
				t.Fatal(err)
			}
			if !proto.Equal(got, tc.job) {
				t.Fatalf("%s decodes to %v, want %v (run with -update to accept a deliberate change)", path, got, tc.job)
			}
		})
	}
}

// TestJobRefused: an agent refuses a job that is not a Job's encoding.
func TestJobRefused(t *testing.T) {
	regular, err := proto.Marshal(regularJob())
	if err != nil {
		t.Fatal(err)
	}
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
		{"invalid UTF-8 in the request id", badUTF8(&Job{RequestId: "b1-\x7f"})},
		{"invalid UTF-8 in a trace value", badUTF8(&Job{Trace: map[string]string{"k": "\x7f"}})},
		{"field number 0", []byte{0x02, 0x00}},
		{"a continuation that is no message", []byte{0x6a, 0x01, 0x00}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := proto.Unmarshal(tc.data, new(Job)); err == nil {
				t.Fatal("accepted")
			}
		})
	}
}

// FuzzDecodeJob: whatever an agent pulls, a job it accepts encodes and
// decodes again to itself.
func FuzzDecodeJob(f *testing.F) {
	for _, tc := range typicalJobs() {
		data, err := proto.Marshal(tc.job)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		job := new(Job)
		if proto.Unmarshal(data, job) != nil {
			return
		}
		out, err := proto.Marshal(job)
		if err != nil {
			t.Fatalf("a decoded job does not encode: %v", err)
		}
		again := new(Job)
		if err := proto.Unmarshal(out, again); err != nil || !proto.Equal(job, again) {
			t.Fatalf("re-decode differs (%v): %v, was %v", err, again, job)
		}
	})
}
