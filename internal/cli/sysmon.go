package cli

import (
	"os"
	"strings"
)

// SysmonSetting is the GODEBUG setting the broker and worker-agent
// commands run with unless GODEBUG names schedtrace itself: a scheduler
// trace every 2^31-1 ms (24.8 days), which keeps the runtime's sysmon
// thread from its deep sleep.
//
// Why: when every P of a Go process is idle, sysmon sleeps until the next
// timer, and the next system call any goroutine makes wakes it with a
// futex (entersyscall), resetting its tick to 20 µs; it then polls at
// that tick, taking from a syscall any P held longer than one tick and
// waking another thread to run it, until the process is idle again. A
// relay goes idle between tokens thousands of times a second, so this
// was a thread wake per burst of work plus a 20 µs poll in between: on
// the bench host the broker's sysmon thread switched 5,500 times a
// second and used 6.5% of a core at 64 streams, and the agent's P moved
// between three threads. A trace period keeps sysmon out of the deep
// sleep, so it backs off to its 10 ms tick and stays there (golang/go
// #18236 is the runtime's issue on this tick). At 64 streams it took 8%
// off the broker's CPU per 1-token request and 14% off the agents', and
// 17% and 34% off their CPU per token of 64-token requests
// (docs/benchmarks.md, issue 15).
//
// The cost: sysmon wakes every 10 ms in an idle process too, and a host
// up for more than 24.8 days gets one "SCHED" line on stderr when the
// process starts (and one per 24.8 days after). GODEBUG=schedtrace=0
// restores Go's default.
const SysmonSetting = "schedtrace=2147483647"

// SysmonEnv returns env (KEY=value entries, as os.Environ) with
// SysmonSetting added to GODEBUG, and whether it added it: not when
// GODEBUG already names schedtrace, whatever its value.
func SysmonEnv(env []string) ([]string, bool) {
	i := -1
	for j, kv := range env {
		if v, ok := strings.CutPrefix(kv, "GODEBUG="); ok {
			i = j
			for s := range strings.SplitSeq(v, ",") {
				if k, _, _ := strings.Cut(strings.TrimSpace(s), "="); k == "schedtrace" {
					return env, false
				}
			}
		}
	}
	out := append([]string(nil), env...)
	if i < 0 {
		return append(out, "GODEBUG="+SysmonSetting), true
	}
	if v := strings.TrimPrefix(out[i], "GODEBUG="); v != "" {
		out[i] = "GODEBUG=" + v + "," + SysmonSetting
	} else {
		out[i] = "GODEBUG=" + SysmonSetting
	}
	return out, true
}

// KeepSysmonAwake starts the running binary again in this process, with
// the same arguments and SysmonEnv's environment, so that the runtime
// reads SysmonSetting (it reads schedtrace only at start). Call it first
// thing in main. It returns only when it does not exec: GODEBUG names
// schedtrace already (as it does once re-executed), or the exec failed
// or is not supported here, in which case the process goes on with Go's
// default and loses only the CPU this saves.
func KeepSysmonAwake() {
	env, ok := SysmonEnv(os.Environ())
	if !ok {
		return
	}
	reexec(os.Args, env)
}
