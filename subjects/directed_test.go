package subjects

import (
	"strings"
	"testing"
)

func TestDirected(t *testing.T) {
	b := Must("sy")
	for _, tc := range []struct {
		name, model, pool, pair, agent, want string
	}{
		{"regular", "m", PoolRegular, "", "a1", "sy.to.m.regular.a1"},
		{"escaped agent", "org/m", PoolRegular, "", "node.1", "sy.to.org_2Fm.regular.node_2E1"},
		{"prefill pairing", "m", PoolPrefill, "vllm", "p-1", "sy.to.m.prefill.vllm.p-1"},
		{"prefill without pairing", "m", PoolPrefill, "", "p-1", "sy.to.m.prefill.p-1"},
		{"agent named to", "m", PoolRegular, "", "to", "sy.to.m.regular.to"},
		{"pairing named to", "m", PoolPrefill, "to", "to", "sy.to.m.prefill.to.to"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := b.Directed(tc.model, tc.pool, tc.pair, tc.agent)
			if err != nil || got != tc.want {
				t.Fatalf("Directed = %q, %v; want %q", got, err, tc.want)
			}
			pj, err := b.ParseJobs(got)
			if err != nil || pj != (Jobs{Model: tc.model, Pool: tc.pool, Pair: tc.pair, To: tc.agent}) {
				t.Fatalf("ParseJobs = %+v, %v", pj, err)
			}
			// The jobs stream's subjects and the directed stream's never
			// overlap: JetStream refuses two streams that do.
			if strings.HasPrefix(got, strings.TrimSuffix(b.JobsAll(), ">")) || !strings.HasPrefix(got, strings.TrimSuffix(b.DirectedAll(), ">")) {
				t.Fatalf("directed %q outside %q or inside %q", got, b.DirectedAll(), b.JobsAll())
			}
			n1, _ := DirectedConsumerName(tc.model, tc.pool, tc.pair, tc.agent)
			n2, _ := DirectedConsumerName(tc.model, tc.pool, tc.pair, tc.agent+"x")
			if n1 == "" || n1 == n2 || strings.ContainsAny(n1, ".*> ") {
				t.Fatalf("consumer names %q %q", n1, n2)
			}
		})
	}
	for _, bad := range []string{"sy.jobs.m.regular.to.a", "sy.jobs.m.prefill.p.to.a", "sy.to.m.regular.x.a", "sy.to.m.other.a", "sy.to.m.prefill.p.a.b", "sy.to.m.regular"} {
		if _, err := b.ParseJobs(bad); err == nil {
			t.Errorf("ParseJobs(%q) accepted", bad)
		}
	}
	if _, err := b.Directed("m", PoolRegular, "", ""); err == nil {
		t.Error("empty agent accepted")
	}
	if _, err := b.Directed("m", PoolRegular, "p", "a"); err == nil {
		t.Error("regular queue with a pairing accepted")
	}
	if got := DirectedStream("SWITCHYARD_JOBS"); got != "SWITCHYARD_JOBS_DIRECTED" {
		t.Errorf("DirectedStream = %q", got)
	}
}

func TestKVAndLearn(t *testing.T) {
	b := Must("sy")
	kv, err := b.KV("org/m", PoolPrefill, "a.1")
	if err != nil || kv != "sy.kv.org_2Fm.prefill.a_2E1" {
		t.Fatalf("KV = %q, %v", kv, err)
	}
	if p, err := b.ParseKV(kv); err != nil || p != (Heartbeat{"org/m", PoolPrefill, "a.1"}) {
		t.Fatalf("ParseKV = %+v, %v", p, err)
	}
	l, err := b.Learn("m", PoolRegular, "b1")
	if err != nil || l != "sy.learn.m.regular.b1" {
		t.Fatalf("Learn = %q, %v", l, err)
	}
	if p, err := b.ParseLearn(l); err != nil || p.Agent != "b1" {
		t.Fatalf("ParseLearn = %+v, %v", p, err)
	}
	if _, err := b.Learn("m", PoolRegular, "b.1"); err == nil {
		t.Fatal("unsafe broker id accepted")
	}
	if b.KVAll() != "sy.kv.>" || b.LearnAll() != "sy.learn.>" {
		t.Fatal("wildcards")
	}
	if _, err := b.ParseKV(l); err == nil {
		t.Fatal("learn subject parsed as kv")
	}
}

func FuzzDirected(f *testing.F) {
	f.Add("m", "a")
	f.Add("meta-llama/Llama-3.1-8B", "to")
	f.Fuzz(func(t *testing.T, model, agent string) {
		b := Must("sy")
		s, err := b.Directed(model, PoolPrefill, "vllm", agent)
		if err != nil {
			return
		}
		pj, err := b.ParseJobs(s)
		if err != nil || pj != (Jobs{Model: model, Pool: PoolPrefill, Pair: "vllm", To: agent}) {
			t.Fatalf("ParseJobs(%q) = %+v, %v", s, pj, err)
		}
	})
}

func TestBatchJobs(t *testing.T) {
	b := Must("sy")
	for _, tc := range []struct {
		name, model, pool, pair, want, consumer string
	}{
		{"regular", "m", PoolRegular, "", "sy.jobs.m.batch.regular", "jobs-m-regular-batch"},
		{"escaped model", "org/m", PoolRegular, "", "sy.jobs.org_2Fm.batch.regular", "jobs-org_2Fm-regular-batch"},
		{"model named batch", "batch", PoolRegular, "", "sy.jobs.batch.batch.regular", "jobs-batch-regular-batch"},
		{"prefill pairing", "m", PoolPrefill, "vllm", "sy.jobs.m.batch.prefill.vllm", ""},
		{"decode pairing named to", "m", PoolDecode, "to", "sy.jobs.m.batch.decode.to", ""},
		{"prefill without pairing", "m", PoolPrefill, "", "sy.jobs.m.batch.prefill", "jobs-m-prefill-batch"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := b.BatchJobs(tc.model, tc.pool, tc.pair)
			if err != nil || got != tc.want {
				t.Fatalf("BatchJobs = %q, %v; want %q", got, err, tc.want)
			}
			pj, err := b.ParseJobs(got)
			if err != nil || pj != (Jobs{Model: tc.model, Pool: tc.pool, Pair: tc.pair, Batch: true}) {
				t.Fatalf("ParseJobs = %+v, %v", pj, err)
			}
			// Neither the interactive queue's filter nor a directed one
			// of the same pool is the batch subject.
			var shared string
			if tc.pair == "" {
				shared, _ = b.Jobs(tc.model, tc.pool)
			} else {
				shared, _ = b.PDJobs(tc.model, tc.pool, tc.pair)
			}
			dir, _ := b.Directed(tc.model, tc.pool, tc.pair, "batch")
			if got == shared || got == dir {
				t.Fatalf("batch subject %q equals an interactive one", got)
			}
			name, err := BatchConsumerName(tc.model, tc.pool, tc.pair)
			inter, _ := ConsumerName(tc.model, tc.pool)
			if tc.pair != "" {
				inter, _ = PDConsumerName(tc.model, tc.pool, tc.pair)
			}
			if err != nil || name == inter || strings.ContainsAny(name, ".*> ") || (tc.consumer != "" && name != tc.consumer) {
				t.Fatalf("BatchConsumerName = %q, %v (interactive %q)", name, err, inter)
			}
		})
	}
	if _, err := b.BatchJobs("m", PoolRegular, "p"); err == nil {
		t.Error("regular batch queue with a pairing accepted")
	}
	if _, err := b.BatchJobs("m", "other", ""); err == nil {
		t.Error("unknown pool accepted")
	}
	for _, bad := range []string{"sy.jobs.m.batch.other", "sy.jobs.m.batch.regular.p", "sy.jobs.m.batch.prefill.p.x", "sy.jobs.m.batch"} {
		if j, err := b.ParseJobs(bad); err == nil {
			t.Errorf("ParseJobs(%q) = %+v", bad, j)
		}
	}
	// The interactive subjects parse as they did, without the class.
	for _, s := range []string{"sy.jobs.m.regular", "sy.jobs.m.prefill.vllm", "sy.to.m.regular.batch"} {
		if j, err := b.ParseJobs(s); err != nil || j.Batch {
			t.Errorf("ParseJobs(%q) = %+v, %v", s, j, err)
		}
	}
}
