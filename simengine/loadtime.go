package simengine

import (
	"errors"
	"fmt"
	"time"
)

// LoadTime is a flag.Value for Config.LoadTime: a duration, or "never"
// for LoadNever. Both sim-engine and the worker-agent's in-process
// simulator take it.
type LoadTime time.Duration

func (l *LoadTime) String() string {
	if time.Duration(*l) == LoadNever {
		return "never"
	}
	return time.Duration(*l).String()
}

// Set parses a duration or "never".
func (l *LoadTime) Set(s string) error {
	if s == "never" {
		*l = LoadTime(LoadNever)
		return nil
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("want a duration or never: %w", err)
	}
	if d < 0 {
		return errors.New("must not be negative")
	}
	*l = LoadTime(d)
	return nil
}
