package main

/*
#include "capi.h"
*/
import "C"

import (
	"fmt"
	"os"
	"runtime"
	"runtime/cgo"
	"runtime/debug"
	"strings"
	"time"
	"unsafe"

	"github.com/rdt-project/rdt/core/engine"
	"github.com/rdt-project/rdt/core/transport"
)

// guard runs one export: it recovers panics (no Go panic may cross the C
// ABI), turns memory faults on bad pointers into INVALID_ARGUMENT, and on
// failure records the thread's last error. Every export goes through it.
func guard(fn string, body func() error) (status C.int) {
	old := debug.SetPanicOnFault(true)
	defer debug.SetPanicOnFault(old)
	defer func() {
		if r := recover(); r != nil {
			status = fail(fn, panicError(r))
		}
	}()
	if err := body(); err != nil {
		return fail(fn, err)
	}
	return 0
}

func panicError(r any) error {
	if re, ok := r.(runtime.Error); ok && strings.Contains(re.Error(), "fault") {
		return transport.Errorf(transport.ErrInvalidArgument, "a pointer argument points to memory that cannot be read or written (%v)", re)
	}
	stack := debug.Stack()
	fmt.Fprintf(os.Stderr, "rdt: internal error: %v\n%s\n", r, stack)
	return transport.Errorf(transport.ErrInternal, "internal error: %v (please report; the stack was printed to stderr)", r)
}

func fail(fn string, err error) C.int {
	st := transport.StatusOf(err)
	msg := fn + ": " + err.Error()
	C.rdtc_set_last_error((*C.char)(unsafe.Pointer(unsafe.StringData(msg))), C.size_t(len(msg)))
	return C.int(st)
}

func invalid(format string, args ...any) error {
	return transport.Errorf(transport.ErrInvalidArgument, format, args...)
}

// runtimeHandle is what an rdt_runtime handle holds.
type runtimeHandle struct {
	rt      *engine.Runtime
	address *C.char // owned; freed at destroy
}

// refHandle is what an rdt_ref handle holds.
type refHandle struct{ ref *engine.Ref }

// pendingHandle is what an rdt_pending handle holds: a get or a write
// under way (the engine runs both as an engine.Fetch).
type pendingHandle struct{ f *engine.Fetch }

func newPending(f *engine.Fetch) any { return &pendingHandle{f: f} }

func newHandle(v any) C.uintptr_t { return C.uintptr_t(cgo.NewHandle(v)) }

// guardOpen is guard for the calls that make a handle: out must not be
// NULL, and what open returns becomes a new handle in *out.
func guardOpen(fn string, out *C.uintptr_t, open func() (any, error)) C.int {
	return guard(fn, func() error {
		if out == nil {
			return invalid("out is NULL")
		}
		v, err := open()
		if err != nil {
			return err
		}
		*out = newHandle(v)
		return nil
	})
}

// lookup resolves a handle of type T. NULL, deleted, bogus and wrongly
// typed handles are INVALID_ARGUMENT, never a crash.
func lookup[T any](h C.uintptr_t, what string) (v T, err error) {
	if h == 0 {
		return v, invalid("%s is NULL", what)
	}
	defer func() {
		if recover() != nil {
			err = invalid("%s is not a valid handle (already freed or released, or never created)", what)
		}
	}()
	x := cgo.Handle(h).Value()
	v, ok := x.(T)
	if !ok {
		return v, invalid("%s is not a valid handle (it is a handle of another kind)", what)
	}
	return v, nil
}

// guardOn is guard for the calls on one handle of type T: h (named what
// in errors) is resolved before body runs.
func guardOn[T any](fn string, h C.uintptr_t, what string, body func(T) error) C.int {
	return guard(fn, func() error {
		v, err := lookup[T](h, what)
		if err != nil {
			return err
		}
		return body(v)
	})
}

// guardRuntime is guardOn for the calls on a runtime handle.
func guardRuntime(fn string, h C.uintptr_t, body func(*engine.Runtime) error) C.int {
	return guardOn(fn, h, "rt", func(rh *runtimeHandle) error { return body(rh.rt) })
}

// guardRef is guardOn for the calls on a ref handle.
func guardRef(fn string, h C.uintptr_t, what string, body func(*engine.Ref) error) C.int {
	return guardOn(fn, h, what, func(rh *refHandle) error { return body(rh.ref) })
}

// guardFree is guardOn for the calls that end a handle: h is deleted
// before end runs.
func guardFree[T any](fn string, h C.uintptr_t, what string, end func(T) error) C.int {
	return guardOn(fn, h, what, func(v T) error {
		deleteHandle(h)
		return end(v)
	})
}

func deleteHandle(h C.uintptr_t) {
	defer func() { recover() }() // a concurrent release already deleted it
	cgo.Handle(h).Delete()
}

func runtimeOf(h C.uintptr_t) (*engine.Runtime, error) {
	rh, err := lookup[*runtimeHandle](h, "rt")
	if err != nil {
		return nil, err
	}
	return rh.rt, nil
}

func refOf(h C.uintptr_t, what string) (*engine.Ref, error) {
	rh, err := lookup[*refHandle](h, what)
	if err != nil {
		return nil, err
	}
	return rh.ref, nil
}

// duration converts a C timeout in milliseconds to a Duration: negative is
// -1 (no deadline: wait forever), and values too large for a Duration are
// cut to about 146 years rather than wrapping round. Every *_ms argument
// and field goes through it.
func duration(ms C.int64_t) time.Duration {
	if ms < 0 {
		return -1
	}
	return time.Duration(min(int64(ms), int64(time.Duration(1<<62)/time.Millisecond))) * time.Millisecond
}

// goString reads an optional C string; NULL is "".
func goString(s *C.char) string {
	if s == nil {
		return ""
	}
	return C.GoString(s)
}

// copyName fills a fixed char array (with its NUL) from s.
func copyName(dst []C.char, s string) {
	n := min(len(s), len(dst)-1)
	for i := 0; i < n; i++ {
		dst[i] = C.char(s[i])
	}
	dst[n] = 0
}
