package broker

import (
	"time"

	"github.com/switchyard-ai/switchyard/wire"
)

// readerClock is the reader's timing of the call: one timer stands for
// three (see Next), the request's deadline, the stall check and the watch;
// it fires at armed, the earliest of them. The reader owns every field;
// no lock.
//
// The stall check is not moved per chunk (a timer operation per token adds
// up): when it is due, the reader pushes it back by the time since it last
// asked for a chunk (see Call.checkStall). The watch runs every
// Config.WatchInterval (see Call.checkWatch).
type readerClock struct {
	held     *wire.Chunk // the chunk Next returned last (see release)
	timer    *time.Timer
	armed    time.Time
	deadline time.Time     // the request's (Call.Deadline), from the first ask on
	stall    time.Duration // Config.StallTimeout
	watch    time.Duration // Config.WatchInterval
	stallAt  time.Time     // when the stall check is due
	watchAt  time.Time     // when the watch is due
	asked    time.Time     // when the reader last asked for a chunk (see Next)
}

// ask records that the reader asks for a chunk now. The first ask sets the
// clock up: its deadline, its stall timeout and watch interval, and its
// timer, one of the pool's (see timers), which stop gives back.
func (k *readerClock) ask(deadline time.Time, stall, watch time.Duration) {
	k.asked = time.Now()
	if k.timer == nil {
		k.deadline, k.stall, k.watch = deadline, stall, watch
		k.stallAt = k.asked.Add(stall)
		k.watchAt = k.asked.Add(watch)
		k.armed = k.due()
		k.timer = timers.Get().(*time.Timer)
		k.timer.Reset(k.armed.Sub(k.asked))
	}
}

// fired takes the timer's firing: it is no longer armed. It returns the
// time to judge what is due by.
func (k *readerClock) fired() time.Time {
	k.armed = time.Time{}
	return time.Now()
}

// expired reports whether the request's deadline has passed at now.
func (k *readerClock) expired(now time.Time) bool { return !now.Before(k.deadline) }

// stallDue reports whether the stall check is due at now.
func (k *readerClock) stallDue(now time.Time) bool { return !now.Before(k.stallAt) }

// watchDue reports whether the watch is due at now, and if so sets the
// next one an interval from now.
func (k *readerClock) watchDue(now time.Time) bool {
	if now.Before(k.watchAt) {
		return false
	}
	k.watchAt = now.Add(k.watch)
	return true
}

// restartStall gives a new attempt the whole stall timeout.
func (k *readerClock) restartStall() {
	k.asked = time.Now()
	k.stallIn(k.stall)
}

// stallIn moves the stall check to d from now.
func (k *readerClock) stallIn(d time.Duration) {
	k.stallAt = time.Now().Add(d)
	k.rearm()
}

// due is when the timer should fire next: the earliest of the deadline,
// the stall check and the watch.
func (k *readerClock) due() time.Time {
	d := k.deadline
	if k.stallAt.Before(d) {
		d = k.stallAt
	}
	if k.watchAt.Before(d) {
		d = k.watchAt
	}
	return d
}

// rearm sets the timer to fire at due, unless it fires before that
// anyway: a timer that fires early finds nothing due and is set again.
func (k *readerClock) rearm() {
	if k.timer == nil {
		return // the first ask sets it up
	}
	d := k.due()
	if !k.armed.IsZero() && !d.Before(k.armed) {
		return
	}
	k.armed = d
	k.timer.Reset(time.Until(d))
}

// stop gives the timer back to the pool: the reader asks no more (Close
// is its last call), and the timer serves the next call.
func (k *readerClock) stop() {
	if k.timer != nil {
		k.timer.Stop()
		timers.Put(k.timer)
		k.timer = nil
	}
}
