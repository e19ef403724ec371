package engine

import (
	"sync"
	"time"

	"github.com/rdt-project/rdt/core/transport"
)

// MaxTakeReleased bounds how many user data one TakeReleased moves, so
// that a caller's capacity never sizes an allocation; callers loop for
// more.
const MaxTakeReleased = 1 << 16

// releaseQueue holds the user data of freed objects of a runtime created
// with Options.QueueReleases until the application takes them. It grows
// by one entry per object freed with user data, and entries leave it only
// when taken.
type releaseQueue struct {
	mu     sync.Mutex
	items  []uintptr     // the puts' user data, opaque to Go
	ready  chan struct{} // holds a token while items is not empty
	closed chan struct{}
	once   sync.Once
}

func newReleaseQueue() *releaseQueue {
	return &releaseQueue{ready: make(chan struct{}, 1), closed: make(chan struct{})}
}

// push queues userData, unless the queue was closed: what the runtime's
// destroy frees is never reported.
func (q *releaseQueue) push(userData uintptr) {
	select {
	case <-q.closed:
		return
	default:
	}
	q.mu.Lock()
	q.items = append(q.items, userData)
	q.mu.Unlock()
	q.signal()
}

// signal leaves a token for the next waiter; one is enough, since a taker
// that leaves items behind signals again.
func (q *releaseQueue) signal() {
	select {
	case q.ready <- struct{}{}:
	default:
	}
}

// take moves up to len(out) items into out, oldest first, waiting up to
// timeout (< 0: forever, 0: not at all) for the first.
func (q *releaseQueue) take(out []uintptr, timeout time.Duration) (int, error) {
	var expired <-chan time.Time
	for {
		select {
		case <-q.closed:
			return 0, transport.Errorf(transport.ErrClosed, "the runtime was destroyed")
		default:
		}
		q.mu.Lock()
		n := copy(out, q.items)
		if n > 0 {
			q.items = q.items[:copy(q.items, q.items[n:])]
			more := len(q.items) > 0
			q.mu.Unlock()
			if more {
				q.signal()
			}
			return n, nil
		}
		q.mu.Unlock()
		if timeout == 0 {
			return 0, nil
		}
		if expired == nil && timeout > 0 {
			t := time.NewTimer(timeout)
			defer t.Stop()
			expired = t.C
		}
		select {
		case <-q.ready:
		case <-expired:
			return 0, nil
		case <-q.closed:
			return 0, transport.Errorf(transport.ErrClosed, "the runtime was destroyed")
		}
	}
}

func (q *releaseQueue) close() { q.once.Do(func() { close(q.closed) }) }

// QueuesReleases reports whether the runtime was created with
// Options.QueueReleases.
func (rt *Runtime) QueuesReleases() bool { return rt.releases != nil }

// ReleaseToQueue is the release function of a put in a runtime that
// queues releases: when the object is freed, userData is queued for
// TakeReleased.
func (rt *Runtime) ReleaseToQueue(userData uintptr) func() {
	q := rt.releases
	return func() { q.push(userData) }
}

// TakeReleased moves up to min(len(out), MaxTakeReleased) queued user data
// into out, oldest first, and returns how many it moved. It waits up to
// timeout (< 0: forever, 0: not at all) for the first; running out of time
// is not an error. A call waiting when the runtime is destroyed returns
// ErrClosed.
func (rt *Runtime) TakeReleased(out []uintptr, timeout time.Duration) (int, error) {
	if rt.releases == nil {
		return 0, transport.Errorf(transport.ErrInvalidArgument, "runtime %s does not queue releases: its release callbacks are called instead", rt.me.name)
	}
	if len(out) > MaxTakeReleased {
		out = out[:MaxTakeReleased]
	}
	return rt.releases.take(out, timeout)
}
