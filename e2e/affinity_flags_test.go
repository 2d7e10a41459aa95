package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/switchyard-ai/switchyard/affinity"
	"github.com/switchyard-ai/switchyard/internal/cmdtest"
	"github.com/switchyard-ai/switchyard/internal/testwait"
)

// TestAffinityTreeFlags: the broker command's --affinity-block-size and
// --affinity-max-blocks reach the tree (they were once parsed and then
// dropped): a prompt is cut into blocks of the given size, and the tree
// never holds more entries than the bound however many prompts it learns.
func TestAffinityTreeFlags(t *testing.T) {
	const blockSize, maxBlocks = 32, 40
	b := cmdtest.StartBroker(t, "--affinity", "approx", "--affinity-block-size", fmt.Sprint(blockSize), "--affinity-max-blocks", fmt.Sprint(maxBlocks))
	e := cachingEngine(t)
	startAgent(t, b.NATS, "a0", e, 2)
	cmdtest.WaitEligible(t, b.HTTP, "a0")

	// One prompt: the tree holds its keys at the flag's block size.
	sys := longSystem("flags-0")
	servedBy(t, b.HTTP, chatTurn(sys, "first question"), e)
	want := len(affinity.AppendChatKeys(nil, blockSize, []affinity.Message{{Role: "system", Content: sys}, {Role: "user", Content: "first question"}}))
	if def := len(affinity.AppendChatKeys(nil, affinity.DefaultBlockSize, []affinity.Message{{Role: "system", Content: sys}, {Role: "user", Content: "first question"}})); def == want {
		t.Fatalf("test prompt too short: %d blocks at both sizes", want)
	}
	testwait.For(t, 5*time.Second, 10*time.Millisecond, func() error {
		if n := affinityBlocks(t, b.HTTP); n != want {
			return fmt.Errorf("tree holds %d blocks, want %d (block size %d)", n, want, blockSize)
		}
		return nil
	})

	// More distinct prompts than the bound holds: evicted down to it.
	for c := 1; c < 6; c++ {
		sys := longSystem(fmt.Sprintf("flags-%d", c)) + strings.Repeat(fmt.Sprintf(" more words of conversation %d", c), 20)
		servedBy(t, b.HTTP, chatTurn(sys, "a question"), e)
	}
	if n := affinityBlocks(t, b.HTTP); n > maxBlocks || n == 0 {
		t.Fatalf("tree holds %d blocks, want 1..%d (--affinity-max-blocks)", n, maxBlocks)
	}
}
