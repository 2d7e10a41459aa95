package main

import (
	"context"
	"net"
	"testing"
	"time"
)

func TestRoundTrips(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	done := make(chan error, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			done <- err
			return
		}
		done <- echo(c)
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rtts, err := roundTrips(ctx, ln.Addr().String(), 200, 700) // larger than echo's buffer: two reads
	if err != nil {
		t.Fatal(err)
	}
	if len(rtts) != 200 {
		t.Fatalf("%d round trips, want 200", len(rtts))
	}
	if q := quantile(rtts, 0.5); q != rtts[99] {
		t.Fatalf("p50 of 200 = %v, want the 100th, %v", q, rtts[99])
	}
	for i := 1; i < len(rtts); i++ {
		if rtts[i] < rtts[i-1] || rtts[0] <= 0 {
			t.Fatalf("round trips not sorted and positive: %v", rtts[:i+1])
		}
	}
	if err := <-done; err != nil {
		t.Fatalf("echo ended with %v, want nil at the client's close", err)
	}
}

func TestRoundTripsWithoutEcho(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		c, err := ln.Accept()
		if err == nil {
			c.Close() // reads nothing back
		}
	}()
	defer ln.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := roundTrips(ctx, ln.Addr().String(), 10, 32); err == nil {
		t.Fatal("round trips to a peer that closes: want an error")
	}
}
