package subjects

import (
	"errors"
	"strings"
	"testing"
)

var escapeCases = []struct {
	name, in, want string
}{
	{"plain", "llama3", "llama3"},
	{"hf id", "meta-llama/Llama-3.1-8B", "meta-llama_2FLlama-3_2E1-8B"},
	{"dot", "a.b", "a_2Eb"},
	{"star", "*", "_2A"},
	{"gt", ">", "_3E"},
	{"space", "a b", "a_20b"},
	{"tab", "a\tb", "a_09b"},
	{"underscore", "a_b", "a_5Fb"},
	{"dollar sys", "$SYS", "_24SYS"},
	{"inbox", "_INBOX.x", "_5FINBOX_2Ex"},
	{"utf8", "modèle", "mod_C3_A8le"},
	{"invalid utf8", "\xff\xfe", "_FF_FE"},
	{"nul", "\x00", "_00"},
}

func TestEscape(t *testing.T) {
	for _, tc := range escapeCases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Escape(tc.in)
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Fatalf("Escape(%q) = %q, want %q", tc.in, got, tc.want)
			}
			back, err := Unescape(got)
			if err != nil || back != tc.in {
				t.Fatalf("Unescape(%q) = %q, %v; want %q", got, back, err, tc.in)
			}
		})
	}
}

func TestEscapeErrors(t *testing.T) {
	if _, err := Escape(""); !errors.Is(err, ErrEmpty) {
		t.Fatalf("empty: %v", err)
	}
	if _, err := Escape(strings.Repeat(".", MaxTokenLen)); !errors.Is(err, ErrTooLong) {
		t.Fatalf("long: %v", err)
	}
	if _, err := Escape(strings.Repeat("a", MaxTokenLen)); err != nil {
		t.Fatalf("max plain: %v", err)
	}
}

func TestUnescapeRejects(t *testing.T) {
	for _, tc := range []struct{ name, in string }{
		{"empty", ""},
		{"dot", "a.b"},
		{"truncated", "a_2"},
		{"lower hex", "a_2eb"},
		{"non-canonical plain", "_61"},
		{"bad hex", "_ZZ"},
		{"star", "*"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got, err := Unescape(tc.in); err == nil {
				t.Fatalf("Unescape(%q) = %q, want error", tc.in, got)
			}
		})
	}
}

func TestBuildParse(t *testing.T) {
	b := Must(DefaultPrefix)
	for _, tc := range []struct {
		name, model, pool, agent, want, wantHB string
	}{
		{"regular", "m", PoolRegular, "node-1", "sy.jobs.m.regular", "sy.hb.m.regular.node-1"},
		{"hf", "org/M-1.5", PoolPrefill, "gpu_3", "sy.jobs.org_2FM-1_2E5.prefill", "sy.hb.org_2FM-1_2E5.prefill.gpu_5F3"},
		{"wild", "*", PoolDecode, ">", "sy.jobs._2A.decode", "sy.hb._2A.decode._3E"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			j, err := b.Jobs(tc.model, tc.pool)
			if err != nil || j != tc.want {
				t.Fatalf("Jobs = %q, %v; want %q", j, err, tc.want)
			}
			pj, err := b.ParseJobs(j)
			if err != nil || pj != (Jobs{Model: tc.model, Pool: tc.pool}) {
				t.Fatalf("ParseJobs = %+v, %v", pj, err)
			}
			h, err := b.Heartbeat(tc.model, tc.pool, tc.agent)
			if err != nil || h != tc.wantHB {
				t.Fatalf("Heartbeat = %q, %v; want %q", h, err, tc.wantHB)
			}
			ph, err := b.ParseHeartbeat(h)
			if err != nil || ph != (Heartbeat{tc.model, tc.pool, tc.agent}) {
				t.Fatalf("ParseHeartbeat = %+v, %v", ph, err)
			}
		})
	}
	r, err := b.Reply("b1", "r42")
	if err != nil || r != "sy.reply.b1.r42" {
		t.Fatalf("Reply = %q, %v", r, err)
	}
	if pr, err := b.ParseReply(r); err != nil || pr != (Reply{"b1", "r42"}) {
		t.Fatalf("ParseReply = %+v, %v", pr, err)
	}
	c, err := b.Cancel("r42")
	if err != nil || c != "sy.cancel.r42" {
		t.Fatalf("Cancel = %q, %v", c, err)
	}
	if id, err := b.ParseCancel(c); err != nil || id != "r42" {
		t.Fatalf("ParseCancel = %q, %v", id, err)
	}
	if b.JobsAll() != "sy.jobs.>" || b.HeartbeatsAll() != "sy.hb.>" || b.CancelAll() != "sy.cancel.*" {
		t.Fatal("wildcard subjects changed")
	}
	if ra, _ := b.ReplyAll("b1"); ra != "sy.reply.b1.*" {
		t.Fatalf("ReplyAll = %q", ra)
	}
}

func TestBuildErrors(t *testing.T) {
	b := Must("prod.sy")
	for _, tc := range []struct {
		name string
		fn   func() (string, error)
	}{
		{"bad pool", func() (string, error) { return b.Jobs("m", "other") }},
		{"empty model", func() (string, error) { return b.Jobs("", PoolRegular) }},
		{"empty agent", func() (string, error) { return b.Heartbeat("m", PoolRegular, "") }},
		{"reply id with dot", func() (string, error) { return b.Reply("b.1", "r") }},
		{"reply id star", func() (string, error) { return b.Reply("b", "*") }},
		{"cancel empty", func() (string, error) { return b.Cancel("") }},
		{"reply all bad", func() (string, error) { return b.ReplyAll(">") }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if s, err := tc.fn(); err == nil {
				t.Fatalf("got %q, want error", s)
			}
		})
	}
	for _, s := range []string{"sy.jobs.m.regular", "prod.sy.jobs.m", "prod.sy.jobs.m.regular.x", "prod.sy.jobs.m.prefill.a.b", "prod.sy.jobs.m.decode._2e", "prod.sy.hb.m.other.a", "prod.sy.jobs.a_2eb.regular"} {
		if _, err := b.ParseJobs(s); err == nil {
			t.Errorf("ParseJobs(%q) accepted", s)
		}
	}
	if _, err := b.ParseHeartbeat("prod.sy.hb.m.regular"); err == nil {
		t.Error("short heartbeat accepted")
	}
	if _, err := b.ParseReply("prod.sy.reply.b.*"); err == nil {
		t.Error("wildcard reply accepted")
	}
	if _, err := b.ParseCancel("prod.sy.cancel.a.b"); err == nil {
		t.Error("long cancel accepted")
	}
}

func TestNewPrefix(t *testing.T) {
	for _, tc := range []struct {
		name, prefix string
		ok           bool
	}{
		{"default", "sy", true},
		{"multi", "prod.sy", true},
		{"empty", "", false},
		{"empty token", "a..b", false},
		{"trailing dot", "sy.", false},
		{"star", "sy.*", false},
		{"gt", ">", false},
		{"space", "s y", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := New(tc.prefix)
			if (err == nil) != tc.ok {
				t.Fatalf("New(%q) err = %v, want ok=%v", tc.prefix, err, tc.ok)
			}
		})
	}
}

// validToken is the property every escaped token must hold.
func validToken(tok string) bool {
	if tok == "" {
		return false
	}
	for i := 0; i < len(tok); i++ {
		if !plain(tok[i]) && tok[i] != '_' {
			return false
		}
	}
	return true
}

func FuzzEscape(f *testing.F) {
	for _, tc := range escapeCases {
		f.Add(tc.in)
	}
	f.Add(strings.Repeat("é", 200))
	b := Must(DefaultPrefix)
	f.Fuzz(func(t *testing.T, s string) {
		tok, err := Escape(s)
		if err != nil {
			if s != "" && !errors.Is(err, ErrTooLong) {
				t.Fatalf("Escape(%q): %v", s, err)
			}
			return
		}
		if !validToken(tok) {
			t.Fatalf("Escape(%q) = %q: not a valid token", s, tok)
		}
		back, err := Unescape(tok)
		if err != nil || back != s {
			t.Fatalf("round trip %q -> %q -> %q, %v", s, tok, back, err)
		}
		subj, err := b.Jobs(s, PoolDecode)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Count(subj, ".") != 3 {
			t.Fatalf("Jobs(%q) = %q: wrong token count", s, subj)
		}
		pj, err := b.ParseJobs(subj)
		if err != nil || pj.Model != s {
			t.Fatalf("ParseJobs(%q) = %+v, %v", subj, pj, err)
		}
	})
}

func FuzzUnescape(f *testing.F) {
	for _, tc := range escapeCases {
		f.Add(tc.want)
	}
	f.Add("_2e")
	f.Fuzz(func(t *testing.T, tok string) {
		s, err := Unescape(tok)
		if err != nil {
			return
		}
		// Injectivity: an accepted token is the one canonical escape of s.
		again, err := Escape(s)
		if err != nil || again != tok {
			t.Fatalf("Unescape(%q) = %q but Escape gives %q, %v", tok, s, again, err)
		}
	})
}

func TestConsumerName(t *testing.T) {
	a, err := ConsumerName("org/m.1", PoolRegular)
	if err != nil || a != "jobs-org_2Fm_2E1-regular" {
		t.Fatalf("ConsumerName = %q, %v", a, err)
	}
	long1, _ := ConsumerName(strings.Repeat("x", 300)+"1", PoolDecode)
	long2, _ := ConsumerName(strings.Repeat("x", 300)+"2", PoolDecode)
	if long1 == long2 || len(long1) > 200 || !validToken(long1) {
		t.Fatalf("long names %q %q", long1, long2)
	}
	if _, err := ConsumerName("m", "x"); err == nil {
		t.Fatal("bad pool accepted")
	}
}

func TestPDJobs(t *testing.T) {
	b := Must("sy")
	for _, tc := range []struct {
		name, model, pool, pair, want string
	}{
		{"vllm", "m", PoolPrefill, "vllm", "sy.jobs.m.prefill.vllm"},
		{"labels", "org/m.1", PoolDecode, PairKey("sglang", "kv=mooncake,v=0.5.2"), "sy.jobs.org_2Fm_2E1.decode.sglang_2Bkv_3Dmooncake_2Cv_3D0_2E5_2E2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := b.PDJobs(tc.model, tc.pool, tc.pair)
			if err != nil || got != tc.want {
				t.Fatalf("PDJobs = %q, %v; want %q", got, err, tc.want)
			}
			pj, err := b.ParseJobs(got)
			if err != nil || pj != (Jobs{Model: tc.model, Pool: tc.pool, Pair: tc.pair}) {
				t.Fatalf("ParseJobs = %+v, %v", pj, err)
			}
		})
	}
	if _, err := b.PDJobs("m", PoolRegular, "vllm"); err == nil {
		t.Fatal("regular PD queue accepted")
	}
	if _, err := b.PDJobs("m", PoolPrefill, ""); err == nil {
		t.Fatal("empty pairing accepted")
	}
	if _, err := b.ParseJobs("sy.jobs.m.regular.vllm"); err == nil {
		t.Fatal("regular queue with a pairing parsed")
	}
	a, _ := PDConsumerName("m", PoolPrefill, "vllm")
	c, _ := PDConsumerName("m", PoolPrefill, "sglang")
	if a == c || !validToken(a) || !strings.HasPrefix(a, "jobs-m-prefill-") {
		t.Fatalf("PD consumer names %q %q", a, c)
	}
}

func TestCanonicalLabels(t *testing.T) {
	for _, tc := range []struct {
		name, in, want string
		bad            bool
	}{
		{name: "empty", in: "  ", want: ""},
		{name: "sorted", in: "version=0.11, kv=nixl", want: "kv=nixl,version=0.11"},
		{name: "no value", in: "kv", bad: true},
		{name: "empty value", in: "kv=", bad: true},
		{name: "twice", in: "kv=a,kv=b", bad: true},
		{name: "space inside", in: "kv=a b", bad: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := CanonicalLabels(tc.in)
			if (err != nil) != tc.bad || got != tc.want {
				t.Fatalf("CanonicalLabels(%q) = %q, %v", tc.in, got, err)
			}
		})
	}
	if PairKey("vllm", "") != "vllm" || PairKey("vllm", "kv=nixl") != "vllm+kv=nixl" {
		t.Fatal("PairKey")
	}
}

// TestJobsProbe: the probe subject is inside the jobs stream's filter, and
// no queue's subject, so ParseJobs refuses it; a bad broker id is refused.
func TestJobsProbe(t *testing.T) {
	b := Must("sy")
	s, err := b.JobsProbe("b1")
	if err != nil || s != "sy.jobs.b1" {
		t.Fatalf("JobsProbe = %q, %v", s, err)
	}
	if _, err := b.ParseJobs(s); err == nil {
		t.Fatalf("ParseJobs(%q) parsed a probe as a queue", s)
	}
	if _, err := b.JobsProbe("a.b"); err == nil {
		t.Fatal("JobsProbe took an id with a dot")
	}
}
