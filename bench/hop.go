package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os/exec"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"time"
)

// The process-hop floor: what one message between two processes costs on
// this machine, in this run. On the first token's path Switchyard has two
// processes more than a client calling an engine directly (the broker and
// an agent), so four one-way hops more; a proxy has two. The TTFT a front
// end adds cannot go below its hops, whatever its code does.

// echoArg is the re-executed form of this program that serves echo.
const echoArg = "__echo"

var echoListening = regexp.MustCompile(`^echo listening on (\S+)$`)

// runEcho listens on a loopback port, prints it, and echoes one
// connection until it closes.
func runEcho() error {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	defer ln.Close()
	fmt.Printf("echo listening on %s\n", ln.Addr())
	c, err := ln.Accept()
	if err != nil {
		return err
	}
	return echo(c)
}

// echo writes back what it reads from c until c ends. Not io.Copy: a TCP
// connection's ReadFrom splices, which is not the read-and-write a relay
// does.
func echo(c net.Conn) error {
	defer c.Close()
	buf := make([]byte, 512)
	for {
		n, err := c.Read(buf)
		if n > 0 {
			if _, werr := c.Write(buf[:n]); werr != nil {
				return werr
			}
		}
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
	}
}

// roundTrips sends n messages of size bytes to the echo at addr, one at a
// time, and returns each round trip's time, sorted.
func roundTrips(ctx context.Context, addr string, n, size int) ([]time.Duration, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = c.SetDeadline(dl)
	}
	out, in := make([]byte, size), make([]byte, size)
	rtts := make([]time.Duration, 0, n)
	for range n {
		t0 := time.Now()
		if _, err := c.Write(out); err != nil {
			return nil, err
		}
		if _, err := io.ReadFull(c, in); err != nil {
			return nil, err
		}
		rtts = append(rtts, time.Since(t0))
	}
	slices.Sort(rtts)
	return rtts, nil
}

// pingArg is the re-executed form of this program that measures round
// trips to an echo: "__ping ADDR N" prints their p50 and p99 in ns.
const pingArg = "__ping"

var pingResult = regexp.MustCompile(`^round trips p50 (\d+) ns p99 (\d+) ns$`)

// runPing is the measuring end of hopFloor, a process of its own so that
// it can be placed on a CPU as a whole.
func runPing(addr, count string) error {
	n, err := strconv.Atoi(count)
	if err != nil || n < 1 {
		return fmt.Errorf("round trips %q: want a positive count", count)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rtts, err := roundTrips(ctx, addr, n, 32)
	if err != nil {
		return err
	}
	fmt.Printf("round trips p50 %d ns p99 %d ns\n", quantile(rtts, 0.5).Nanoseconds(), quantile(rtts, 0.99).Nanoseconds())
	return nil
}

// quantile of sorted durations, by nearest rank below.
func quantile(sorted []time.Duration, q float64) time.Duration {
	return sorted[int(q*float64(len(sorted)-1))]
}

// hop is one placement's round trips, in ms.
type hop struct {
	where    string
	p50, p99 float64
}

// hopFloor measures round trips between two processes of this program,
// both on CPU 0 and then on CPUs 0 and 1 (taskset): on a VM a wake-up
// that crosses to an idle vCPU can cost many times one on the same CPU,
// and where the scheduler puts two processes is chance, so an unpinned
// figure would be either. Without taskset or a second CPU it measures
// what it can.
func (e *env) hopFloor(n int) ([]hop, error) {
	placements := [][2]string{{"0", "0"}, {"0", "1"}}
	taskset, err := exec.LookPath("taskset")
	if err != nil {
		placements = [][2]string{{"", ""}}
	} else if runtime.NumCPU() < 2 {
		placements = placements[:1]
	}
	var hops []hop
	for _, pl := range placements {
		run := func(name, cpu string, args ...string) (*proc, error) {
			if cpu == "" {
				return e.sup.start(name, e.self, args...)
			}
			return e.sup.start(name, taskset, append([]string{"-c", cpu, e.self}, args...)...)
		}
		h, err := func() (hop, error) {
			echo, err := run("hop-echo", pl[0], echoArg)
			if err != nil {
				return hop{}, err
			}
			defer func() { _ = echo.stop(time.Second) }()
			m, err := echo.waitFor(e.ctx, echoListening, 20*time.Second)
			if err != nil {
				return hop{}, err
			}
			ping, err := run("hop-ping", pl[1], pingArg, m[1], strconv.Itoa(n))
			if err != nil {
				return hop{}, err
			}
			defer func() { _ = ping.stop(time.Second) }()
			r, err := ping.waitFor(e.ctx, pingResult, time.Minute)
			if err != nil {
				return hop{}, err
			}
			p50, _ := strconv.ParseFloat(r[1], 64)
			p99, _ := strconv.ParseFloat(r[2], 64)
			where := "unpinned"
			switch {
			case pl[0] == "":
			case pl[0] == pl[1]:
				where = "same CPU"
			default:
				where = "two CPUs"
			}
			return hop{where: where, p50: p50 / 1e6, p99: p99 / 1e6}, nil
		}()
		if err != nil {
			return nil, fmt.Errorf("hop floor: %w", err)
		}
		hops = append(hops, h)
	}
	return hops, nil
}
