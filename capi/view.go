package main

/*
#include "capi.h"
*/
import "C"

import (
	"unsafe"

	"github.com/rdt-project/rdt/core/engine"
	"github.com/rdt-project/rdt/core/transport"
)

// viewHandle is what an rdt_view* names.
type viewHandle struct{ v *engine.View }

//export rdtgo_view_open
func rdtgo_view_open(h C.uintptr_t, ref C.uintptr_t, copts *C.rdt_view_options, ms C.int64_t, out *C.uintptr_t) C.int {
	return guardOpen("rdt_view_open", out, func() (any, error) {
		rt, err := runtimeOf(h)
		if err != nil {
			return nil, err
		}
		r, err := refOf(ref, "ref")
		if err != nil {
			return nil, err
		}
		var opts engine.ViewOptions
		if copts != nil {
			if copts.flags&^C.RDT_VIEW_PRIVATE != 0 {
				return nil, invalid("unknown view flags %#x", uint32(copts.flags&^C.RDT_VIEW_PRIVATE))
			}
			opts.Private = copts.flags&C.RDT_VIEW_PRIVATE != 0
			opts.Transport = goString(copts.transport)
		}
		v, err := rt.View(r, opts, duration(ms))
		return &viewHandle{v: v}, err
	})
}

//export rdtgo_view_data
func rdtgo_view_data(h C.uintptr_t, data *C.uintptr_t, count C.size_t, mapped *C.int) C.int {
	return guard("rdt_view_data", func() error {
		vh, err := fillView(h, data, count, "data_out", func(t transport.Tensor) C.uintptr_t { return C.uintptr_t(t.Data) })
		if err != nil {
			return err
		}
		if mapped != nil {
			*mapped = 0
			if vh.v.Mapped() {
				*mapped = 1
			}
		}
		return nil
	})
}

//export rdtgo_view_sizes
func rdtgo_view_sizes(h C.uintptr_t, nbytes *C.uint64_t, count C.size_t) C.int {
	return guard("rdt_view_sizes", func() error {
		_, err := fillView(h, nbytes, count, "nbytes_out", func(t transport.Tensor) C.uint64_t { return C.uint64_t(t.Nbytes) })
		return err
	})
}

// fillView resolves a view handle and fills the caller's array of count
// entries, one per tensor of the view, with value of that tensor.
func fillView[T any](h C.uintptr_t, arr *T, count C.size_t, name string, value func(transport.Tensor) T) (*viewHandle, error) {
	vh, err := lookup[*viewHandle](h, "view")
	if err != nil {
		return nil, err
	}
	if n := len(vh.v.Tensors()); uint64(count) != uint64(n) {
		return nil, invalid("count is %d; the object has %d tensors", uint64(count), n)
	}
	if arr == nil && count > 0 {
		return nil, invalid("%s is NULL", name)
	}
	if count == 0 {
		return vh, nil
	}
	out := unsafe.Slice(arr, int(count))
	for i, t := range vh.v.Tensors() {
		out[i] = value(t)
	}
	return vh, nil
}

//export rdtgo_view_release
func rdtgo_view_release(h C.uintptr_t) C.int {
	return guardFree("rdt_view_release", h, "view", func(vh *viewHandle) error {
		return vh.v.Release()
	})
}
