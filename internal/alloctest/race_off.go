//go:build !race

package alloctest

// Race: built with the race detector (see race_on.go).
const Race = false
