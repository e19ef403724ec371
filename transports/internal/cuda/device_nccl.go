package cuda

// What libraries that work with the calling thread's current context (NCCL)
// need: a device made current on a locked OS thread, and the raw handles of
// streams to pass them.

/*
#include "shim.h"
*/
import "C"

import (
	"runtime"
	"unsafe"
)

// OnDevice runs fn on a locked OS thread with dev's primary context
// current, then restores the thread's previous context. fn must not start
// work that outlives it on that thread.
func OnDevice(dev int, fn func() error) error {
	if err := Load(); err != nil {
		return err
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var saved unsafe.Pointer
	if err := check("cuCtxSetCurrent", C.rdtcu_ctx_enter(C.int(dev), &saved)); err != nil {
		return err
	}
	ferr := fn()
	lerr := check("cuCtxSetCurrent", C.rdtcu_ctx_leave(saved))
	if ferr != nil {
		return ferr
	}
	return lerr
}

// Handle is the stream's CUstream, for libraries that enqueue work on it
// (a CUstream is also a cudaStream_t).
func (s *Stream) Handle() unsafe.Pointer { return unsafe.Pointer(s.s) }

// Record records e on s: e completes once the work enqueued on s before it
// has. Both must belong to the same device.
func (e *Event) Record(s *Stream) error {
	_, err := CopyAsync(s.dev, s.dev, s, nil, e)
	return err
}
