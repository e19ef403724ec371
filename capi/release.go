package main

/*
#include "capi.h"
*/
import "C"

import (
	"sync"
	"time"
	"unsafe"

	"github.com/rdt-project/rdt/core/transport"
)

// releaseQueue holds the user data of freed objects of a runtime created
// with RDT_RUNTIME_QUEUE_RELEASES, until the application takes them.
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

func (q *releaseQueue) push(userData uintptr) {
	q.mu.Lock()
	q.items = append(q.items, userData)
	q.mu.Unlock()
	select {
	case q.ready <- struct{}{}:
	default:
	}
}

// take moves up to len(out) items into out, waiting up to timeout (< 0:
// forever) for the first.
func (q *releaseQueue) take(out []uintptr, timeout time.Duration) (int, error) {
	var expired <-chan time.Time
	for {
		q.mu.Lock()
		n := copy(out, q.items)
		if n > 0 {
			q.items = q.items[:copy(q.items, q.items[n:])]
			more := len(q.items) > 0
			q.mu.Unlock()
			if more {
				select {
				case q.ready <- struct{}{}:
				default:
				}
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

//export rdtgo_runtime_take_released
func rdtgo_runtime_take_released(h C.uintptr_t, userData *C.uintptr_t, capacity C.size_t,
	count *C.size_t, timeoutMS C.int64_t) C.int {
	return guard("rdt_runtime_take_released", func() error {
		rh, err := lookup[*runtimeHandle](h, "rt")
		if err != nil {
			return err
		}
		if userData == nil || count == nil {
			return invalid("user_data and count must not be NULL")
		}
		if capacity == 0 {
			return invalid("capacity is 0")
		}
		if rh.releases == nil {
			return invalid("runtime %s was not created with RDT_RUNTIME_QUEUE_RELEASES: its release callbacks are called instead", rh.rt.Name())
		}
		const most = 1 << 16 // bounds the Go-side buffer; callers loop for more
		n := int(min(capacity, most))
		buf := make([]uintptr, n)
		timeout := time.Duration(timeoutMS) * time.Millisecond
		if timeoutMS < 0 {
			timeout = -1
		}
		got, err := rh.releases.take(buf, timeout)
		if err != nil {
			return err
		}
		dst := unsafe.Slice((*uintptr)(unsafe.Pointer(userData)), n) // C's void *[], read as integers
		copy(dst, buf[:got])
		*count = C.size_t(got)
		return nil
	})
}
