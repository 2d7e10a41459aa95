//go:build !unix

package procs

import (
	"runtime/metrics"
	"time"
)

// cpuTime is the runtime's estimate of the CPU time its Ps were busy so
// far (available minus idle), where getrusage is not there.
func cpuTime() time.Duration {
	s := []metrics.Sample{{Name: "/cpu/classes/total:cpu-seconds"}, {Name: "/cpu/classes/idle:cpu-seconds"}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindFloat64 || s[1].Value.Kind() != metrics.KindFloat64 {
		return 0
	}
	return time.Duration((s[0].Value.Float64() - s[1].Value.Float64()) * float64(time.Second))
}
