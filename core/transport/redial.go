package transport

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"syscall"
	"time"
)

// The backoff between tries of a dial (Redial): the first wait is drawn
// from [redialFirst/2, redialFirst], each next one from twice the range
// before, up to [redialMax/2, redialMax]. The common case, a neighbour
// entry that failed while a link was down, is over after one try (the next
// one resolves the neighbour afresh), so the first wait is short; the cap
// keeps a dead host from being dialed more than about twice a second.
const (
	redialFirst = 50 * time.Millisecond
	redialMax   = time.Second
)

// transientErrnos are the connect errors that a try a moment later may
// not meet: the network towards the host is not there for the moment (no
// route to it or to its network, a neighbour entry the kernel gave up on
// while a link was down, a local interface down), the kernel's own tries
// timed out, or a Unix socket's backlog is full.
var transientErrnos = []syscall.Errno{
	syscall.EHOSTUNREACH,
	syscall.ENETUNREACH,
	syscall.EHOSTDOWN,
	syscall.ENETDOWN,
	syscall.ETIMEDOUT,
	syscall.EAGAIN,
}

// TransientDialError reports whether err, a failed dial, may well not
// happen again if the dial is tried once more: one of transientErrnos, or
// a dial that timed out on its own (a link that drops packets). A refused
// connection is not transient: the host is up and nothing listens on the
// port, which means the runtime there is gone, and the caller is told at
// once. Neither is anything that happened after the connection was made
// (a failed handshake): callers wrap only the dial's own error with %w.
func TransientDialError(err error) bool {
	for _, e := range transientErrnos {
		if errors.Is(err, e) {
			return true
		}
	}
	var t interface{ Timeout() bool }
	return errors.As(err, &t) && t.Timeout()
}

// Redial calls dial until it succeeds, fails with an error that is not
// transient (TransientDialError), or no time is left: ctx's deadline, or
// limit after the first try when ctx has none (so that a caller who gave
// no deadline is still told about a host that stays unreachable). Between
// tries it waits, jittered and doubling (redialFirst to redialMax), never
// past ctx's end, and logs each failed try at debug level: a retry is
// expected after a partition heals, not a fault. The error when it gives
// up says what it tried (what), how many times, and the last cause (Tried): with
// ctx's status when ctx ended (ErrTimeout at a deadline, or the cause ctx
// was cancelled with), else with that of the last failure.
func Redial[T any](ctx context.Context, limit time.Duration, log *Logger, what string, dial func(context.Context) (T, error)) (T, error) {
	var zero T
	start := time.Now()
	end, hasDeadline := ctx.Deadline()
	if !hasDeadline {
		end = start.Add(limit)
	}
	var last error // the last transient failure
	gaveUp := func(tries int) error {
		if ctx.Err() != nil {
			return ContextError(ctx, "%s: %s", what, Tried(tries, last))
		}
		return Errorf(StatusOf(last), "%s: %s", what, Tried(tries, last))
	}
	span := redialFirst
	for tries := 1; ; tries++ {
		v, err := dial(ctx)
		switch {
		case err == nil:
			if tries > 1 {
				log.Debugf("%s: connected on try %d, %.1f s after the first", what, tries, time.Since(start).Seconds())
			}
			return v, nil
		case ctx.Err() != nil && last != nil:
			return zero, gaveUp(tries - 1) // this try was cut short
		case ctx.Err() != nil || !TransientDialError(err):
			return zero, err
		}
		last = err
		wait := span/2 + rand.N(span/2+1)
		span = min(2*span, redialMax)
		left := time.Until(end)
		if !hasDeadline && wait >= left {
			return zero, gaveUp(tries)
		}
		log.Debugf("%s: try %d failed, trying again in %d ms: %v", what, tries, wait.Milliseconds(), err)
		// No try starts after the deadline: the wait ends with ctx there.
		timer := time.NewTimer(wait)
		select {
		case <-timer.C:
			if hasDeadline && !time.Now().Before(end) {
				<-ctx.Done()
				return zero, gaveUp(tries)
			}
		case <-ctx.Done():
			timer.Stop()
			return zero, gaveUp(tries)
		}
	}
}

// Tried says what a dial that was tried again did: how many tries failed,
// and the last one's error.
func Tried(tries int, last error) string {
	if tries == 1 {
		return fmt.Sprintf("1 try failed: %v", last)
	}
	return fmt.Sprintf("%d tries failed, the last: %v", tries, last)
}
