#!/usr/bin/env bash
# A/B of two builds on the same machine, back to back: CPU per relayed token
# and per request (broker and agents, from /proc), allocations per request
# (go_memstats_mallocs_total from each process's /metrics: unlike CPU on a
# shared machine, the same build gives the same count run after run),
# output tokens/s, TTFT p50 and p99, ITL p50 and p99 and end-to-end p50.
#
#   git worktree add /tmp/before <commit> && (cd /tmp/before && go build -o /tmp/before-bin/ ./cmd/...)
#   go build -o /tmp/after-bin/ ./cmd/...
#   bench/ab.sh /tmp/before-bin /tmp/after-bin        # STREAMS=128 REQUESTS=3000 ITL=1ms TOKENS=32 ROUNDS=2 WARMUP=0
#
# Two sim-engines, a broker on embedded NATS and two agents per run, on
# fixed loopback ports (18001, 18002, 18080, 14222); the load generator is
# the second build's. Interleave rounds: this machine's speed drifts.
# Slow start is off in the broker and the agents, as in the runner, so
# that both measure a fleet at its full slots from its first request.
set -euo pipefail
[ $# -ge 1 ] || { echo "usage: $0 BIN_A [BIN_B ...]" >&2; exit 2; }
STREAMS=${STREAMS:-128} REQUESTS=${REQUESTS:-3000} ITL=${ITL:-1ms} TOKENS=${TOKENS:-32} ROUNDS=${ROUNDS:-2} WARMUP=${WARMUP:-0}
last="${*: -1}"
pids=()
stop() { for p in "${pids[@]:-}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; pids=(); }
trap stop EXIT
cpu() { local t=0 f; for p in "$@"; do read -r -a f < "/proc/$p/stat"; t=$((t + f[13] + f[14])); done; echo "$t"; }
# until_ok waits up to 30 s for the command to succeed, polling every 20 ms.
until_ok() { local i; for i in $(seq 1500); do "$@" >/dev/null 2>&1 && return 0; sleep 0.02; done; echo "ab.sh: timed out waiting for: $*" >&2; return 1; }
# eligible succeeds when the broker's fleet view lists $1 eligible agents.
eligible() { [ "$(curl -sf 127.0.0.1:18080/v1/fleet | grep -o '"eligible":true' | wc -l)" -ge "$1" ]; }
# mallocs prints the allocations so far of the process serving /metrics on port $1 (0 if none).
mallocs() { curl -s "127.0.0.1:$1/metrics" | awk '$1 == "go_memstats_mallocs_total" { printf "%.0f\n", $2; found = 1 } END { if (!found) print 0 }'; }
one() {
	local bin=$1 data
	data=$(mktemp -d)
	"$bin/sim-engine" --listen 127.0.0.1:18001 --ttft 0 --itl "$ITL" --slots 512 --model sim-model >/dev/null 2>&1 & pids+=($!)
	"$bin/sim-engine" --listen 127.0.0.1:18002 --ttft 0 --itl "$ITL" --slots 512 --model sim-model >/dev/null 2>&1 & pids+=($!)
	until_ok curl -sf 127.0.0.1:18001/v1/models
	until_ok curl -sf 127.0.0.1:18002/v1/models
	"$bin/broker" --http 127.0.0.1:18080 --grpc "" --nats-listen 127.0.0.1:14222 --data-dir "$data" --slow-start 0 --log-level warn >/dev/null 2>&1 & pids+=($!); local bp=$!
	until_ok curl -sf 127.0.0.1:18080/readyz
	"$bin/worker-agent" --engine openai --engine-url http://127.0.0.1:18001 --model sim-model --slots 512 --slow-start 0 --nats-url nats://127.0.0.1:14222 --metrics-listen 127.0.0.1:19101 --log-level warn >/dev/null 2>&1 & pids+=($!); local a1=$!
	"$bin/worker-agent" --engine openai --engine-url http://127.0.0.1:18002 --model sim-model --slots 512 --slow-start 0 --nats-url nats://127.0.0.1:14222 --metrics-listen 127.0.0.1:19102 --log-level warn >/dev/null 2>&1 & pids+=($!); local a2=$!
	until_ok eligible 2
	local b0 b1 g0 g1 m0 m1 n0 n1 out
	b0=$(cpu "$bp") g0=$(cpu "$a1" "$a2") m0=$(mallocs 18080) n0=$(($(mallocs 19101) + $(mallocs 19102)))
	out=$("$last/loadgen" --url http://127.0.0.1:18080 --model sim-model --concurrency "$STREAMS" --requests "$REQUESTS" --warmup "$WARMUP" \
		--prompt-tokens 16 --max-tokens "$TOKENS" --json 2>/dev/null)
	b1=$(cpu "$bp") g1=$(cpu "$a1" "$a2") m1=$(mallocs 18080) n1=$(($(mallocs 19101) + $(mallocs 19102)))
	stop
	rm -rf "$data"
	echo "$out" | python3 -c '
import json, sys
d = json.load(sys.stdin)
broker, agents, hz, name = int(sys.argv[1]), int(sys.argv[2]), 100, sys.argv[3]
balloc, aalloc = int(sys.argv[4]), int(sys.argv[5])
toks, reqs, tps, ttft, ttft99, itl, itl99, e2e = d["output_tokens"], d["requests"], d["output_tokens_per_s"], d["ttft_ms"]["p50"], d["ttft_ms"]["p99"], d["itl_ms"]["p50"], d["itl_ms"]["p99"], d["e2e_ms"]["p50"]
errs = d["errors"]
nerr = (sum(errs.values()) and errs) if isinstance(errs, dict) else errs
us = lambda t, n: 1e6 * t / hz / max(n, 1)
print("%s: %.1f us CPU per token (broker %.1f, agents %.1f), %.0f us per request (broker %.0f, agents %.0f), %.0f tokens/s, TTFT p50 %.3f ms, p99 %.3f ms, ITL p50 %.2f ms, p99 %.2f ms, end to end p50 %.2f ms, errors %s, allocations per request broker %.1f, agents %.1f" % (
	name, us(broker + agents, toks), us(broker, toks), us(agents, toks), us(broker + agents, reqs), us(broker, reqs), us(agents, reqs), tps, ttft, ttft99, itl, itl99, e2e, nerr,
	balloc / max(reqs, 1), aalloc / max(reqs, 1)))
' "$((b1 - b0))" "$((g1 - g0))" "$bin" "$((m1 - m0))" "$((n1 - n0))"
}
for _ in $(seq "$ROUNDS"); do
	for b in "$@"; do one "$b"; done
done
