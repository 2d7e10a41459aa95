//go:build !race

package broker

const raceOn = false
