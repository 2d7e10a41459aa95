//go:build race

package broker

// raceOn: built with the race detector, which moves some values to the
// heap (allocation counts differ).
const raceOn = true
