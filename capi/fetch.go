package main

/*
#include "capi.h"
*/
import "C"

import (
	"fmt"
	"time"
	"unsafe"

	"github.com/rdt-project/rdt/core/engine"
	"github.com/rdt-project/rdt/core/transport"
)

// getArgs resolves the arguments shared by rdt_get_start, rdt_get and
// rdt_prepare_get (and, without options, those of the writes, whose tensors
// are named what).
func getArgs(h C.uintptr_t, refs *C.uintptr_t, nrefs C.size_t, targets *C.rdt_tensor,
	ntargets C.size_t, copts *C.rdt_get_options, what string) (*engine.Runtime, []*engine.Ref, []transport.Tensor, engine.FetchOptions, error) {
	var opts engine.FetchOptions
	rt, err := runtimeOf(h)
	if err != nil {
		return nil, nil, nil, opts, err
	}
	if nrefs > 0 && refs == nil {
		return nil, nil, nil, opts, invalid("refs is NULL but num_refs is %d", nrefs)
	}
	if nrefs > 1<<20 {
		return nil, nil, nil, opts, invalid("num_refs %d is too large", nrefs)
	}
	var rs []*engine.Ref
	if nrefs > 0 {
		hs := unsafe.Slice(refs, int(nrefs))
		rs = make([]*engine.Ref, len(hs))
		for i, rh := range hs {
			if rs[i], err = refOf(rh, fmt.Sprintf("refs[%d]", i)); err != nil {
				return nil, nil, nil, opts, err
			}
		}
	}
	ts, err := tensorsFromC(targets, ntargets, what)
	if err != nil {
		return nil, nil, nil, opts, err
	}
	if copts != nil {
		opts.Transport = goString(copts.transport)
		if opts.Sources, err = rangesFromC(copts.sources, copts.num_sources, "sources"); err != nil {
			return nil, nil, nil, opts, err
		}
	}
	return rt, rs, ts, opts, nil
}

// targetArgs is getArgs for the calls whose tensors are targets.
func targetArgs(h C.uintptr_t, refs *C.uintptr_t, nrefs C.size_t, targets *C.rdt_tensor,
	ntargets C.size_t, copts *C.rdt_get_options) (*engine.Runtime, []*engine.Ref, []transport.Tensor, engine.FetchOptions, error) {
	return getArgs(h, refs, nrefs, targets, ntargets, copts, "targets")
}

// openCall is guardOpen for the calls that start or prepare a get or a
// write: args (targetArgs or writeArgs) resolves their arguments, start
// takes them, and the handle opened is what wrap makes of its result.
func openCall[CO, O, T any](fn string, h C.uintptr_t, refs *C.uintptr_t, nrefs C.size_t, tensors *C.rdt_tensor,
	ntensors C.size_t, copts *CO, out *C.uintptr_t,
	args func(C.uintptr_t, *C.uintptr_t, C.size_t, *C.rdt_tensor, C.size_t, *CO) (*engine.Runtime, []*engine.Ref, []transport.Tensor, O, error),
	start func(*engine.Runtime, []*engine.Ref, []transport.Tensor, O) (T, error), wrap func(T) any) C.int {
	return guardOpen(fn, out, func() (any, error) {
		rt, rs, ts, opts, err := args(h, refs, nrefs, tensors, ntensors, copts)
		if err != nil {
			return nil, err
		}
		v, err := start(rt, rs, ts, opts)
		return wrap(v), err
	})
}

// runCall is guard for the blocking get and write: args (targetArgs or
// writeArgs) resolves their arguments and run takes them and the deadline.
func runCall[CO, O any](fn string, h C.uintptr_t, refs *C.uintptr_t, nrefs C.size_t, tensors *C.rdt_tensor,
	ntensors C.size_t, copts *CO, ms C.int64_t,
	args func(C.uintptr_t, *C.uintptr_t, C.size_t, *C.rdt_tensor, C.size_t, *CO) (*engine.Runtime, []*engine.Ref, []transport.Tensor, O, error),
	run func(*engine.Runtime, []*engine.Ref, []transport.Tensor, O, time.Duration) error) C.int {
	return guard(fn, func() error {
		rt, rs, ts, opts, err := args(h, refs, nrefs, tensors, ntensors, copts)
		if err != nil {
			return err
		}
		return run(rt, rs, ts, opts, duration(ms))
	})
}

// rangesFromC copies the rdt_range array opts->`field` of a partial get
// (sources) or write (destinations); nil: every tensor whole.
func rangesFromC(p *C.rdt_range, n C.size_t, field string) ([]engine.Range, error) {
	if p == nil {
		if n != 0 {
			return nil, invalid("opts->%s is NULL but num_%s is %d", field, field, n)
		}
		return nil, nil
	}
	if n > transport.MaxTensors {
		return nil, invalid("%d %s is over the limit of %d", n, field, transport.MaxTensors)
	}
	out := make([]engine.Range, n)
	for i, s := range unsafe.Slice(p, int(n)) {
		out[i] = engine.Range{Ref: int(s.ref), Piece: transport.Piece{Tensor: uint32(s.tensor), Offset: uint64(s.offset), Length: uint64(s.length)}}
	}
	return out, nil
}

//export rdtgo_get_start
func rdtgo_get_start(h C.uintptr_t, refs *C.uintptr_t, nrefs C.size_t, targets *C.rdt_tensor,
	ntargets C.size_t, copts *C.rdt_get_options, out *C.uintptr_t) C.int {
	return openCall("rdt_get_start", h, refs, nrefs, targets, ntargets, copts, out, targetArgs,
		(*engine.Runtime).StartFetch, newPending)
}

//export rdtgo_pending_wait
func rdtgo_pending_wait(h C.uintptr_t, ms C.int64_t) C.int {
	return guardOn("rdt_pending_wait", h, "pending", func(fh *pendingHandle) error {
		return fh.f.Wait(duration(ms))
	})
}

//export rdtgo_pending_abort
func rdtgo_pending_abort(h C.uintptr_t) C.int {
	return guardOn("rdt_pending_abort", h, "pending", func(fh *pendingHandle) error {
		fh.f.Abort()
		return nil
	})
}

//export rdtgo_pending_event_fd
func rdtgo_pending_event_fd(h C.uintptr_t, out *C.int) C.int {
	return guard("rdt_pending_event_fd", func() error {
		if out == nil {
			return invalid("fd_out is NULL")
		}
		fh, err := lookup[*pendingHandle](h, "pending")
		if err != nil {
			return err
		}
		fd, err := fh.f.EventFD()
		if err != nil {
			return err
		}
		*out = C.int(fd)
		return nil
	})
}

//export rdtgo_pending_free
func rdtgo_pending_free(h C.uintptr_t) C.int {
	return guardFree("rdt_pending_free", h, "pending", func(fh *pendingHandle) error {
		fh.f.Free()
		return nil
	})
}

//export rdtgo_get
func rdtgo_get(h C.uintptr_t, refs *C.uintptr_t, nrefs C.size_t, targets *C.rdt_tensor,
	ntargets C.size_t, copts *C.rdt_get_options, ms C.int64_t) C.int {
	return runCall("rdt_get", h, refs, nrefs, targets, ntargets, copts, ms, targetArgs, (*engine.Runtime).Get)
}

//export rdtgo_wait_tensor_freed
func rdtgo_wait_tensor_freed(h C.uintptr_t, data C.uintptr_t, ms C.int64_t) C.int {
	return guardRuntime("rdt_wait_tensor_freed", h, func(rt *engine.Runtime) error {
		return rt.WaitTensorFreed(uintptr(data), duration(ms))
	})
}
