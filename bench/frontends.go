package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
)

// env is what every scenario needs: the built binaries, the process
// supervisor and a scratch directory.
type env struct {
	ctx     context.Context
	bin     string // directory of broker, worker-agent, sim-engine
	self    string // this program, re-executed for profiled brokers and agents
	tmp     string
	sup     *supervisor
	nginx   string
	haproxy string
	quick   bool
	// profiles, when set, receives copies of the tokenpath profiles.
	profiles string
	logf     func(format string, args ...any)
	// goDefaults runs brokers and agents at the Go runtime's defaults.
	goDefaults bool
	// goodputModes, when set, are the only modes the goodput grid
	// measures, each from goodputStart.
	goodputModes []string
	goodputStart float64
}

func (e *env) path(name string) string { return filepath.Join(e.bin, name) }

var (
	engineAddr = regexp.MustCompile(`msg=listening addr=(\S+)`)
	brokerLine = regexp.MustCompile(`switchyard broker listening: http=(\S+) nats=(\S+)`)
	agentLine  = regexp.MustCompile(`switchyard agent \S+ serving`)
)

// engineSpec is one sim-engine process.
type engineSpec struct {
	Slots           int
	TTFT, ITL       time.Duration
	PrefillPerToken time.Duration
}

func (s engineSpec) String() string {
	return fmt.Sprintf("slots %d, ttft %s, itl %s, prefill %s/token", s.Slots, s.TTFT, s.ITL, s.PrefillPerToken)
}

// startEngine starts a sim-engine on a random loopback port and returns
// its address.
func (e *env) startEngine(name string, s engineSpec) (string, error) {
	p, err := e.sup.start(name, e.path("sim-engine"), "--listen", "127.0.0.1:0", "--model", model,
		"--ttft", s.TTFT.String(), "--itl", s.ITL.String(), "--slots", strconv.Itoa(s.Slots),
		"--prefill-per-token", s.PrefillPerToken.String(), "--log-level", "info")
	if err != nil {
		return "", err
	}
	m, err := p.waitFor(e.ctx, engineAddr, 20*time.Second)
	if err != nil {
		return "", err
	}
	return m[1], nil
}

type brokerProc struct {
	*proc
	HTTP, NATS string
}

// startBroker starts the broker on embedded NATS with random ports. With
// profile set the broker runs inside this program (re-executed) under a
// CPU profile written to that file when it stops.
func (e *env) startBroker(name, profile string, args ...string) (*brokerProc, error) {
	dir, err := os.MkdirTemp(e.tmp, "nats-")
	if err != nil {
		return nil, err
	}
	// The jobs stream in memory, as docs/performance.md measures it (the
	// command's default is file).
	base := []string{"--http", "127.0.0.1:0", "--grpc", "", "--nats-listen", "127.0.0.1:0", "--data-dir", dir,
		"--heartbeat-interval", "100ms", "--shutdown-grace", "3s", "--log-level", "warn", "--jobs-storage", "memory"}
	bin := e.path("broker")
	if profile != "" {
		base = append([]string{"__broker", profile}, base...)
		bin = e.self
	}
	p, err := e.sup.startEnv(e.runtimeEnv("broker"), name, bin, append(base, args...)...)
	if err != nil {
		return nil, err
	}
	m, err := p.waitFor(e.ctx, brokerLine, 30*time.Second)
	if err != nil {
		return nil, err
	}
	return &brokerProc{proc: p, HTTP: m[1], NATS: m[2]}, nil
}

// runtimeEnv is the Go runtime's settings for a broker or an agent: those
// the Dockerfile and compose.yaml deploy them with, or none with
// --go-defaults.
func (e *env) runtimeEnv(who string) []string {
	if e.goDefaults {
		return nil
	}
	if who == "agent" {
		return []string{"GOGC=400", "GOMAXPROCS=2"}
	}
	return []string{"GOGC=400"}
}

// startAgent starts a worker-agent; args follow the common ones.
func (e *env) startAgent(id, natsURL, profile string, args ...string) (*proc, error) {
	base := []string{"--nats-url", natsURL, "--id", id, "--model", model, "--heartbeat", "100ms", "--log-level", "warn"}
	bin := e.path("worker-agent")
	if profile != "" {
		base = append([]string{"__agent", profile}, base...)
		bin = e.self
	}
	p, err := e.sup.startEnv(e.runtimeEnv("agent"), "agent-"+id, bin, append(base, args...)...)
	if err != nil {
		return nil, err
	}
	if _, err := p.waitFor(e.ctx, agentLine, 30*time.Second); err != nil {
		return nil, err
	}
	return p, nil
}

// fleetView is the part of GET /v1/fleet the runner reads.
type fleetView struct {
	Models []struct {
		Share  map[string]float64 `json:"share"`
		Queue  map[string]int     `json:"queue"`
		Recent struct {
			Regular int64 `json:"regular"`
			PD      int64 `json:"pd"`
		} `json:"recent"`
	} `json:"models"`
	Agents []struct {
		ID             string  `json:"id"`
		Pool           string  `json:"pool"`
		Slots          int     `json:"slots"`
		Active         int     `json:"active"`
		EffectiveSlots float64 `json:"effective_slots"`
		Eligible       bool    `json:"eligible"`
	} `json:"agents"`
}

func getFleet(ctx context.Context, base string) (fleetView, error) {
	var f fleetView
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/v1/fleet", nil)
	if err != nil {
		return f, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return f, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return f, fmt.Errorf("GET /v1/fleet: %s", resp.Status)
	}
	return f, json.NewDecoder(resp.Body).Decode(&f)
}

// waitEligible waits until the broker sees every id as eligible.
func (e *env) waitEligible(base string, ids ...string) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		f, err := getFleet(e.ctx, base)
		if err == nil {
			ok := 0
			for _, a := range f.Agents {
				for _, id := range ids {
					if a.ID == id && a.Eligible {
						ok++
					}
				}
			}
			if ok == len(ids) {
				return nil
			}
			err = fmt.Errorf("%d of %d agents eligible", ok, len(ids))
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("agents %v: %w", ids, err)
		}
		select {
		case <-e.ctx.Done():
			return e.ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// syFleet is a running Switchyard: the broker and its agents.
type syFleet struct {
	url    string
	broker *brokerProc
	agents []*proc
	prof   [2]string // CPU profiles of the broker and the first agent
}

// switchyard starts a broker and one worker-agent (--engine openai) per
// engine, with agent slots equal to the engine's. With profile set the
// broker and the first agent run under a CPU profile.
func (e *env) switchyard(tag string, engines []string, specs []engineSpec, profile string, brokerArgs ...string) (*syFleet, error) {
	f := &syFleet{}
	if profile != "" {
		f.prof = [2]string{filepath.Join(e.tmp, tag+"-broker.pprof"), filepath.Join(e.tmp, tag+"-agent.pprof")}
	}
	b, err := e.startBroker("broker-"+tag, f.prof[0], brokerArgs...)
	if err != nil {
		return nil, err
	}
	f.broker, f.url = b, b.HTTP
	var ids []string
	for i, addr := range engines {
		id := fmt.Sprintf("%s-a%d", tag, i+1)
		prof := ""
		if i == 0 {
			prof = f.prof[1]
		}
		args := []string{"--engine", "openai", "--engine-url", "http://" + addr, "--slots", strconv.Itoa(specs[i].Slots)}
		// The agents ramp their pull limit by their own --slow-start: it
		// must match the broker's, or a fleet that
		// the broker weighs at full slots pulls a fraction of them for
		// its first 30s, which is all of a scenario's window.
		if j := slices.Index(brokerArgs, "--slow-start"); j >= 0 && j+1 < len(brokerArgs) {
			args = append(args, "--slow-start", brokerArgs[j+1])
		}
		p, err := e.startAgent(id, b.NATS, prof, args...)
		if err != nil {
			return nil, err
		}
		f.agents = append(f.agents, p)
		ids = append(ids, id)
	}
	if err := e.waitEligible(b.HTTP, ids...); err != nil {
		return nil, err
	}
	return f, nil
}

func (f *syFleet) pids() []int {
	ids := []int{f.broker.pid()}
	for _, a := range f.agents {
		ids = append(ids, a.pid())
	}
	return ids
}

// stop stops the agents, then the broker.
func (f *syFleet) stop() error {
	var errs []error
	for _, a := range f.agents {
		errs = append(errs, a.stop(10*time.Second))
	}
	errs = append(errs, f.broker.stop(10*time.Second))
	return errors.Join(errs...)
}

// freePort asks the kernel for a free loopback port for a proxy's config.
func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// ensureProxies finds nginx and HAProxy, installing the Debian packages
// when either is missing (the runner is expected to run as root). Services
// are not started by the packages: RUNLEVEL=1 makes invoke-rc.d skip them.
func (e *env) ensureProxies() error {
	find := func(name string) string {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
		if p := "/usr/sbin/" + name; fileExists(p) {
			return p
		}
		return ""
	}
	e.nginx, e.haproxy = find("nginx"), find("haproxy")
	if e.nginx != "" && e.haproxy != "" {
		return nil
	}
	e.logf("installing nginx and haproxy with apt-get")
	run := func(args ...string) error {
		cmd := exec.CommandContext(e.ctx, "apt-get", args...)
		cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive", "RUNLEVEL=1")
		out, err := cmd.CombinedOutput()
		if err != nil {
			return fmt.Errorf("apt-get %s: %w\n%s", strings.Join(args, " "), err, tailLines(string(out), 20))
		}
		return nil
	}
	if err := run("update"); err != nil {
		return err
	}
	if err := run("install", "-y", "--no-install-recommends", "nginx", "haproxy"); err != nil {
		return err
	}
	e.nginx, e.haproxy = find("nginx"), find("haproxy")
	if e.nginx == "" || e.haproxy == "" {
		return errors.New("nginx or haproxy still missing after apt-get install")
	}
	return nil
}

func fileExists(p string) bool { _, err := os.Stat(p); return err == nil }

func tailLines(s string, n int) string {
	l := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(l[max(0, len(l)-n):], "\n")
}

// startNginx serves two ports in front of engines: round robin and
// least_conn, with the settings an SSE stream needs (no buffering, HTTP/1.1
// and kept-alive connections to the upstreams).
func (e *env) startNginx(tag string, engines []string) (rr, lc string, pid int, err error) {
	dir := filepath.Join(e.tmp, "nginx-"+tag)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", "", 0, err
	}
	prr, err := freePort()
	if err != nil {
		return "", "", 0, err
	}
	plc, err := freePort()
	if err != nil {
		return "", "", 0, err
	}
	var servers strings.Builder
	for _, a := range engines {
		fmt.Fprintf(&servers, "    server %s max_fails=0;\n", a)
	}
	location := `    location / {
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
      proxy_request_buffering off;
      proxy_cache off;
      proxy_read_timeout 300s;
      proxy_send_timeout 300s;
      proxy_next_upstream off;
      tcp_nodelay on;
`
	conf := fmt.Sprintf(`# generated by go run ./bench
worker_processes 2;
worker_rlimit_nofile 65536;
daemon off;
master_process on;
pid %[1]s/nginx.pid;
error_log %[1]s/error.log warn;
events { worker_connections 16384; multi_accept on; }
http {
  access_log off;
  client_body_temp_path %[1]s/body;
  proxy_temp_path %[1]s/proxy;
  fastcgi_temp_path %[1]s/fastcgi;
  uwsgi_temp_path %[1]s/uwsgi;
  scgi_temp_path %[1]s/scgi;
  keepalive_requests 1000000;
  keepalive_timeout 120s;
  upstream rr {
%[2]s    keepalive 1024;
    keepalive_requests 1000000;
  }
  upstream lc {
    least_conn;
%[2]s    keepalive 1024;
    keepalive_requests 1000000;
  }
  server {
    listen 127.0.0.1:%[3]d;
%[5]s      proxy_pass http://rr;
    }
  }
  server {
    listen 127.0.0.1:%[4]d;
%[5]s      proxy_pass http://lc;
    }
  }
}
`, dir, servers.String(), prr, plc, location)
	cfg := filepath.Join(dir, "nginx.conf")
	if err := os.WriteFile(cfg, []byte(conf), 0o644); err != nil {
		return "", "", 0, err
	}
	p, err := e.sup.start("nginx-"+tag, e.nginx, "-e", filepath.Join(dir, "error.log"), "-p", dir, "-c", cfg)
	if err != nil {
		return "", "", 0, err
	}
	rr, lc = fmt.Sprintf("http://127.0.0.1:%d", prr), fmt.Sprintf("http://127.0.0.1:%d", plc)
	for _, u := range []string{rr, lc} {
		if err := e.waitHTTP(u + "/v1/models"); err != nil {
			return "", "", 0, fmt.Errorf("nginx: %w", err)
		}
	}
	return rr, lc, p.pid(), nil
}

// startHAProxy serves one port in front of engines with balance leastconn,
// in HTTP mode with timeouts long enough for streams.
func (e *env) startHAProxy(tag string, engines []string) (string, int, error) {
	dir := filepath.Join(e.tmp, "haproxy-"+tag)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", 0, err
	}
	port, err := freePort()
	if err != nil {
		return "", 0, err
	}
	var servers strings.Builder
	for i, a := range engines {
		fmt.Fprintf(&servers, "  server e%d %s\n", i+1, a)
	}
	conf := fmt.Sprintf(`# generated by go run ./bench
global
  maxconn 8000
  nbthread 2
defaults
  mode http
  option http-no-delay
  timeout connect 5s
  timeout client 300s
  timeout server 300s
  timeout http-keep-alive 120s
  timeout http-request 10s
frontend fe
  bind 127.0.0.1:%d
  default_backend engines
backend engines
  balance leastconn
  http-reuse always
%s`, port, servers.String())
	cfg := filepath.Join(dir, "haproxy.cfg")
	if err := os.WriteFile(cfg, []byte(conf), 0o644); err != nil {
		return "", 0, err
	}
	p, err := e.sup.start("haproxy-"+tag, e.haproxy, "-db", "-f", cfg)
	if err != nil {
		return "", 0, err
	}
	u := fmt.Sprintf("http://127.0.0.1:%d", port)
	if err := e.waitHTTP(u + "/v1/models"); err != nil {
		return "", 0, fmt.Errorf("haproxy: %w", err)
	}
	return u, p.pid(), nil
}

func (e *env) waitHTTP(u string) error {
	deadline := time.Now().Add(20 * time.Second)
	for {
		resp, err := http.Get(u)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			err = errors.New(resp.Status)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("GET %s: %w", u, err)
		}
		select {
		case <-e.ctx.Done():
			return e.ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func versionOf(bin string, args ...string) string {
	if bin == "" {
		return "not installed"
	}
	out, _ := exec.Command(bin, args...).CombinedOutput()
	return strings.TrimSpace(strings.SplitN(string(out), "\n", 2)[0])
}
