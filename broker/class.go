package broker

// Class is a request's work class. Interactive work comes first; batch work
// (the Batches API's lines) runs only on capacity interactive work is not
// using.
type Class uint8

const (
	// ClassInteractive is the zero value: a client waits for the answer.
	ClassInteractive Class = iota
	// ClassBatch is work nobody waits on token by token: agents take it
	// only with room interactive work leaves them.
	ClassBatch
)

// String is the class's name in metrics, logs and /v1/fleet.
func (c Class) String() string {
	switch c {
	case ClassInteractive:
		return "interactive"
	case ClassBatch:
		return "batch"
	}
	return "unknown"
}
