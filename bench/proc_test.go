package main

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"
)

func TestStatTimes(t *testing.T) {
	// A command name may hold spaces and parentheses: the fields are
	// counted from the last ')'.
	const stat = "4242 (nginx: worker (x)) S 4240 4240 4240 0 -1 4194624 1530 0 0 0 712 2946 0 0 20 0 1 0 4470 13459456 1024 18446744073709551615 1 1 0 0 0 0 0 4096 0 0 0 0 17 1 0 0 0 0 0"
	u, s, g, ok := statTimes(stat)
	if !ok || u != 712 || s != 2946 || g != 4240 {
		t.Fatalf("statTimes = %d, %d, %d, %v; want 712, 2946, 4240, true", u, s, g, ok)
	}
	for _, bad := range []string{"", "4242 nginx S 1 2", "4242 (nginx) S 4240 x 4240 0 -1 0 0 0 0 0 712 2946 0"} {
		if _, _, _, ok := statTimes(bad); ok {
			t.Errorf("statTimes(%q) ok, want not", bad)
		}
	}
}

func TestCPUTimesOfABusyProcessGroup(t *testing.T) {
	// A shell spinning in its own process group: its time is user
	// space's, and the split adds up to cpuSeconds.
	cmd := exec.Command("sh", "-c", "while :; do :; done")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Skip(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	pg := []int{cmd.Process.Pid}
	deadline := time.Now().Add(20 * time.Second)
	for cpuTimes(pg).user < 0.3 {
		if time.Now().After(deadline) {
			t.Fatalf("no 0.3 s of user time in 20 s: %+v", cpuTimes(pg))
		}
		time.Sleep(20 * time.Millisecond)
	}
	// Stopped, its times hold still between the two reads.
	if err := syscall.Kill(cmd.Process.Pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	for !stopped(t, cmd.Process.Pid) {
		if time.Now().After(deadline) {
			t.Fatal("the shell did not stop in 20 s")
		}
		time.Sleep(5 * time.Millisecond)
	}
	ct := cpuTimes(pg)
	if ct.user < 0.3 || ct.system > ct.user {
		t.Errorf("a spinning shell: %+v, want mostly user time", ct)
	}
	if got, want := cpuSeconds(pg), cpuAll(ct); got != want {
		t.Errorf("cpuSeconds %v, user+system %v", got, want)
	}
	if d := ct.sub(cpuTime{0.1, 0}); d.user != ct.user-0.1 || d.system != ct.system {
		t.Errorf("sub: %+v", d)
	}
}

// stopped reports whether process pid is in the stopped state ('T' in
// /proc/PID/stat).
func stopped(t *testing.T, pid int) bool {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	i := bytes.LastIndexByte(b, ')')
	return i >= 0 && i+2 < len(b) && b[i+2] == 'T'
}
