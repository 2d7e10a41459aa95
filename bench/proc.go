package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// supervisor starts the processes of a run and stops every one of them,
// also when the run fails or is interrupted: each runs in its own process
// group (a terminal's ctrl-c reaches only the runner, which then stops
// them in order) and dies with the runner if the runner is killed.
type supervisor struct {
	dir string

	mu    sync.Mutex
	procs []*proc
	seq   int
}

type proc struct {
	name string
	cmd  *exec.Cmd
	done chan struct{}
	err  error // valid once done is closed

	mu    sync.Mutex
	lines []string
}

// start runs bin with args; its stdout and stderr go to <dir>/<name>.log
// and are kept for waitFor.
func (s *supervisor) start(name, bin string, args ...string) (*proc, error) {
	return s.startEnv(nil, name, bin, args...)
}

// startEnv is start with env added to the runner's environment.
func (s *supervisor) startEnv(env []string, name, bin string, args ...string) (*proc, error) {
	s.mu.Lock()
	s.seq++
	logPath := filepath.Join(s.dir, fmt.Sprintf("%02d-%s.log", s.seq, name))
	s.mu.Unlock()
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	if len(env) > 0 {
		cmd.Env = append(os.Environ(), env...)
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	p := &proc{name: name, cmd: cmd, done: make(chan struct{})}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	var wg sync.WaitGroup
	var logMu sync.Mutex
	for _, r := range []io.Reader{stdout, stderr} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sc := bufio.NewScanner(r)
			sc.Buffer(make([]byte, 64<<10), 1<<20)
			for sc.Scan() {
				line := sc.Text()
				logMu.Lock()
				fmt.Fprintln(logf, line)
				logMu.Unlock()
				p.mu.Lock()
				if len(p.lines) < 10000 {
					p.lines = append(p.lines, line)
				}
				p.mu.Unlock()
			}
		}()
	}
	go func() {
		wg.Wait()
		p.err = cmd.Wait()
		logf.Close()
		close(p.done)
	}()
	s.mu.Lock()
	s.procs = append(s.procs, p)
	s.mu.Unlock()
	return p, nil
}

// last returns the process started last.
func (s *supervisor) last() *proc {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.procs[len(s.procs)-1]
}

// selfCPU is this process's user and system CPU time in seconds.
func selfCPU() float64 {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds()
}

func (p *proc) pid() int { return p.cmd.Process.Pid }

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// waitFor waits for an output line matching re and returns its submatches.
func (p *proc) waitFor(ctx context.Context, re *regexp.Regexp, timeout time.Duration) ([]string, error) {
	deadline := time.Now().Add(timeout)
	for seen := 0; ; {
		p.mu.Lock()
		for ; seen < len(p.lines); seen++ {
			if m := re.FindStringSubmatch(p.lines[seen]); m != nil {
				p.mu.Unlock()
				return m, nil
			}
		}
		p.mu.Unlock()
		if p.exited() {
			return nil, fmt.Errorf("%s exited (%v) before printing %s:\n%s", p.name, p.err, re, p.tail(20))
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("%s: no line matching %s within %s:\n%s", p.name, re, timeout, p.tail(20))
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
}

func (p *proc) tail(n int) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return strings.Join(p.lines[max(0, len(p.lines)-n):], "\n")
}

// stop sends SIGTERM to the process group and waits up to grace before
// SIGKILL. It returns the exit error, nil for a clean exit on SIGTERM.
func (p *proc) stop(grace time.Duration) error {
	if p.exited() {
		return p.err
	}
	_ = syscall.Kill(-p.pid(), syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(grace):
		_ = syscall.Kill(-p.pid(), syscall.SIGKILL)
		<-p.done
		return fmt.Errorf("%s: killed after %s", p.name, grace)
	}
	var ee *exec.ExitError
	if errors.As(p.err, &ee) && ee.Sys().(syscall.WaitStatus).Signaled() {
		return nil
	}
	return p.err
}

// stopAll stops every process still running, the last started first.
func (s *supervisor) stopAll() {
	s.mu.Lock()
	procs := s.procs
	s.procs = nil
	s.mu.Unlock()
	for i := len(procs) - 1; i >= 0; i-- {
		_ = procs[i].stop(5 * time.Second)
	}
}

// rssKB reads VmRSS of pid from /proc, in KiB.
func rssKB(pid int) (int, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0, err
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			return strconv.Atoi(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")))
		}
	}
	return 0, errors.New("no VmRSS")
}

// cpuSeconds sums user and system CPU time of every process whose process
// group is one of pgids (a supervised process and all its children, such
// as nginx's workers).
func cpuSeconds(pgids []int) float64 {
	return cpuAll(cpuTimes(pgids))
}

// cpuTime is CPU time in seconds, in user space and in the kernel.
type cpuTime struct{ user, system float64 }

func (t cpuTime) sub(u cpuTime) cpuTime { return cpuTime{t.user - u.user, t.system - u.system} }

// cpuTimes is cpuSeconds kept apart by where the time went. The kernel
// splits a process's (exact) runtime into the two by where its clock
// ticks landed, so the split is a sample: good over seconds, not over a
// few ticks.
func cpuTimes(pgids []int) cpuTime {
	want := map[int]bool{}
	for _, g := range pgids {
		want[g] = true
	}
	ents, _ := os.ReadDir("/proc")
	var u, st int64
	for _, de := range ents {
		if _, err := strconv.Atoi(de.Name()); err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + de.Name() + "/stat")
		if err != nil {
			continue
		}
		pu, ps, g, ok := statTimes(string(b))
		if !ok || !want[g] {
			continue
		}
		u += pu
		st += ps
	}
	return cpuTime{float64(u) / 100, float64(st) / 100} // USER_HZ is 100 on Linux
}

// statTimes reads a /proc/PID/stat line's user and system ticks and its
// process group.
func statTimes(stat string) (user, system int64, pgid int, ok bool) {
	i := strings.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, 0, 0, false
	}
	f := strings.Fields(stat[i+1:])
	if len(f) < 13 {
		return 0, 0, 0, false
	}
	pgid, err1 := strconv.Atoi(f[2])
	user, err2 := strconv.ParseInt(f[11], 10, 64)
	system, err3 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil || err3 != nil {
		return 0, 0, 0, false
	}
	return user, system, pgid, true
}
