package grpcapi

import (
	"math"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	switchyardv1 "github.com/switchyard-ai/switchyard/api/switchyard/v1"
)

func user(content string) []*switchyardv1.Message {
	return []*switchyardv1.Message{{Role: "user", Content: content}}
}

func TestChatBody(t *testing.T) {
	tests := []struct {
		name string
		req  *switchyardv1.ChatRequest
		want string
	}{
		{
			name: "minimal",
			req:  &switchyardv1.ChatRequest{Messages: user("hi")},
			want: `{"messages":[{"role":"user","content":"hi"}],"stream":true,"stream_options":{"include_usage":false}}`,
		},
		{
			name: "typed fields",
			req: &switchyardv1.ChatRequest{
				Model:        "meta-llama/Llama-3.1-8B",
				Messages:     []*switchyardv1.Message{{Role: "system", Content: "be <brief> & kind"}, {Role: "user", Content: "hi"}},
				MaxTokens:    proto.Uint32(16),
				Temperature:  proto.Float64(0),
				TopP:         proto.Float64(0.5),
				Seed:         proto.Int64(-7),
				Stop:         []string{"\n", "END"},
				IncludeUsage: true,
			},
			want: `{"max_tokens":16,"messages":[{"role":"system","content":"be <brief> & kind"},{"role":"user","content":"hi"}],` +
				`"model":"meta-llama/Llama-3.1-8B","seed":-7,"stop":["\n","END"],"stream":true,"stream_options":{"include_usage":true},"temperature":0,"top_p":0.5}`,
		},
		{
			name: "extra merged, typed wins",
			req: &switchyardv1.ChatRequest{
				Model:     "m",
				Messages:  user("hi"),
				MaxTokens: proto.Uint32(4),
				ExtraJson: `{"max_tokens": 99, "top_k": 20, "chat_template_kwargs": {"enable_thinking": false}}`,
			},
			want: `{"chat_template_kwargs":{"enable_thinking":false},"max_tokens":4,"messages":[{"role":"user","content":"hi"}],` +
				`"model":"m","stream":true,"stream_options":{"include_usage":false},"top_k":20}`,
		},
		{
			name: "extra fills an unset typed field",
			req:  &switchyardv1.ChatRequest{Messages: user("hi"), ExtraJson: `{"max_tokens":3}`},
			want: `{"max_tokens":3,"messages":[{"role":"user","content":"hi"}],"stream":true,"stream_options":{"include_usage":false}}`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := chatBody(tt.req)
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != tt.want {
				t.Errorf("body\n got %s\nwant %s", got, tt.want)
			}
		})
	}
}

func TestCompletionBody(t *testing.T) {
	got, err := completionBody(&switchyardv1.CompletionRequest{Model: "m", Prompt: "Once upon", MaxTokens: proto.Uint32(5), IncludeUsage: true})
	if err != nil {
		t.Fatal(err)
	}
	want := `{"max_tokens":5,"model":"m","prompt":"Once upon","stream":true,"stream_options":{"include_usage":true}}`
	if string(got) != want {
		t.Errorf("body\n got %s\nwant %s", got, want)
	}
}

func TestBodyInvalid(t *testing.T) {
	tests := []struct {
		name string
		req  *switchyardv1.ChatRequest
		msg  string // part of the status message
	}{
		{"no messages", &switchyardv1.ChatRequest{}, "messages is required"},
		{"no role", &switchyardv1.ChatRequest{Messages: []*switchyardv1.Message{{Content: "x"}}}, "messages[0].role"},
		{"too many messages", &switchyardv1.ChatRequest{Messages: make([]*switchyardv1.Message, maxMessages+1)}, "at most"},
		{"long model", &switchyardv1.ChatRequest{Model: strings.Repeat("m", maxModelLen+1), Messages: user("x")}, "model id"},
		{"max tokens 0", &switchyardv1.ChatRequest{Messages: user("x"), MaxTokens: proto.Uint32(0)}, "max_tokens"},
		{"temperature high", &switchyardv1.ChatRequest{Messages: user("x"), Temperature: proto.Float64(2.5)}, "temperature"},
		{"temperature NaN", &switchyardv1.ChatRequest{Messages: user("x"), Temperature: proto.Float64(math.NaN())}, "temperature"},
		{"top_p 0", &switchyardv1.ChatRequest{Messages: user("x"), TopP: proto.Float64(0)}, "top_p"},
		{"top_p Inf", &switchyardv1.ChatRequest{Messages: user("x"), TopP: proto.Float64(math.Inf(1))}, "top_p"},
		{"too many stops", &switchyardv1.ChatRequest{Messages: user("x"), Stop: make([]string, maxStops+1)}, "stop"},
		{"empty stop", &switchyardv1.ChatRequest{Messages: user("x"), Stop: []string{""}}, "stop[0]"},
		{"extra not JSON", &switchyardv1.ChatRequest{Messages: user("x"), ExtraJson: `{"a":`}, "JSON object"},
		{"extra array", &switchyardv1.ChatRequest{Messages: user("x"), ExtraJson: `[1]`}, "JSON object"},
		{"extra null", &switchyardv1.ChatRequest{Messages: user("x"), ExtraJson: `null`}, "JSON object"},
		{"extra trailing", &switchyardv1.ChatRequest{Messages: user("x"), ExtraJson: `{} {}`}, "JSON object"},
		{"extra sets messages", &switchyardv1.ChatRequest{Messages: user("x"), ExtraJson: `{"messages":[]}`}, `"messages"`},
		{"extra sets stream", &switchyardv1.ChatRequest{Messages: user("x"), ExtraJson: `{"stream":false}`}, `"stream"`},
		{"extra sets n", &switchyardv1.ChatRequest{Messages: user("x"), ExtraJson: `{"n":2}`}, `"n"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for i := range tt.req.Messages {
				if tt.req.Messages[i] == nil {
					tt.req.Messages[i] = &switchyardv1.Message{Role: "user"}
				}
			}
			_, err := chatBody(tt.req)
			st, _ := status.FromError(err)
			if st.Code() != codes.InvalidArgument || !strings.Contains(st.Message(), tt.msg) {
				t.Errorf("got %v, want InvalidArgument containing %q", err, tt.msg)
			}
		})
	}
	if _, err := completionBody(&switchyardv1.CompletionRequest{Model: "m"}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("empty prompt: got %v, want InvalidArgument", err)
	}
}
