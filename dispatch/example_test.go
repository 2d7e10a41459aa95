package dispatch_test

import (
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/switchyard-ai/switchyard/dispatch"
)

func ExampleModel_Decide() {
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	agent := func(id string, pool dispatch.Pool, active int) dispatch.Agent {
		return dispatch.Agent{
			ID: id, Pool: pool, State: dispatch.StateReady,
			Slots: 8, Active: active,
			ReadySince: now.Add(-time.Hour), LastSeen: now, Interval: time.Second,
		}
	}
	// 2 regular agents with 10 free slots between them, 2 prefill agents
	// and 1 decode agent with 3 free slots: PD is as wide as its decode.
	m := dispatch.NewModel("llama", []dispatch.Agent{
		agent("r1", dispatch.PoolRegular, 2),
		agent("r2", dispatch.PoolRegular, 4),
		agent("p1", dispatch.PoolPrefill, 0),
		agent("p2", dispatch.PoolPrefill, 3),
		agent("d1", dispatch.PoolDecode, 5),
	}, now, dispatch.DefaultConfig())

	regular, pd := m.Weights()
	fmt.Printf("weights: regular %v, pd %v (pd share %.0f%%)\n", regular, pd, 100*pd/(regular+pd))

	// r is the caller's random number; here two fixed values show both ends.
	for _, r := range []uint64{0, math.MaxUint64} {
		route, _ := m.Decide(dispatch.Need{}, r)
		fmt.Println("route:", route)
	}

	// A request PD cannot serve goes to regular...
	route, _ := m.Decide(dispatch.Need{NoPD: true, Reason: "n > 1"}, 0)
	fmt.Println("n > 1:", route)

	// ...and fails clearly when there is no regular agent.
	pdOnly := dispatch.NewModel("llama", []dispatch.Agent{
		agent("p1", dispatch.PoolPrefill, 0),
		agent("d1", dispatch.PoolDecode, 0),
	}, now, dispatch.DefaultConfig())
	_, err := pdOnly.Decide(dispatch.Need{NoPD: true, Reason: "n > 1"}, 0)
	fmt.Println(errors.Is(err, dispatch.ErrUnsupported), err)
	// Output:
	// weights: regular 10, pd 6 (pd share 38%)
	// route: pd
	// route: regular
	// n > 1: regular
	// true dispatch: request not supported by the available route: model "llama" has no eligible regular agent and PD cannot serve this request: n > 1
}
