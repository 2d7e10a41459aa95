//go:build unix

package helmtest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/switchyard-ai/switchyard/internal/cmdtest"
)

// proc is one process standing in for a container, in a process group of
// its own so that a kill reaches whatever it started, with its output in a
// file.
type proc struct {
	name string // pod/container
	log  string // the file its stdout and stderr go to
	cmd  *exec.Cmd
	done chan struct{} // closed when it has exited
	err  error         // what Wait returned, once done is closed
}

// procs are the processes of one test, stopped when it ends; a failing
// test logs the end of each one's output.
type procs struct {
	t    *testing.T
	dir  string
	mu   sync.Mutex
	list []*proc
}

func newProcs(t *testing.T) *procs {
	ps := &procs{t: t, dir: t.TempDir()}
	t.Cleanup(func() {
		ps.mu.Lock()
		list := ps.list
		ps.mu.Unlock()
		for _, p := range list {
			p.kill()
		}
		if t.Failed() {
			for _, p := range list {
				b, _ := os.ReadFile(p.log)
				t.Logf("--- output of %s (%s):\n%s", p.name, p.state(), cmdtest.Tail(string(b), 3<<10))
			}
		}
	})
	return ps
}

// start runs bin with args, env as its whole environment and dir as its
// working directory.
func (ps *procs) start(name, bin string, args, env []string, dir string) *proc {
	t := ps.t
	t.Helper()
	f, err := os.Create(filepath.Join(ps.dir, fmt.Sprintf("%02d-%s.log", len(ps.list), sanitize(name))))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	fmt.Fprintf(f, "# %s %q\n# env %q\n", bin, args, env)
	p := &proc{name: name, log: f.Name(), cmd: exec.Command(bin, args...), done: make(chan struct{})}
	p.cmd.Env, p.cmd.Dir = env, dir
	p.cmd.Stdout, p.cmd.Stderr = f, f
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	go func() { p.err = p.cmd.Wait(); close(p.done) }()
	ps.mu.Lock()
	ps.list = append(ps.list, p)
	ps.mu.Unlock()
	return p
}

func sanitize(s string) string {
	b := []byte(s)
	for i, c := range b {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '.') {
			b[i] = '_'
		}
	}
	return string(b)
}

// kill sends SIGKILL to the process group and waits for the process: no
// shutdown of its own, as when a node dies.
func (p *proc) kill() {
	select {
	case <-p.done:
		return
	default:
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	select {
	case <-p.done:
	case <-time.After(30 * time.Second):
	}
}

// exited reports, without waiting, whether the process has ended and how.
func (p *proc) exited() error {
	select {
	case <-p.done:
		if p.err == nil {
			return fmt.Errorf("%s exited with status 0", p.name)
		}
		return fmt.Errorf("%s exited: %v", p.name, p.err)
	default:
		return nil
	}
}

func (p *proc) state() string {
	if err := p.exited(); err != nil {
		return err.Error()
	}
	return "running"
}

// tail is the end of the process's output.
func (p *proc) tail() string {
	b, _ := os.ReadFile(p.log)
	return cmdtest.Tail(string(b), 2<<10)
}
