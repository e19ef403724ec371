package main

/*
#include "capi.h"
*/
import "C"

import (
	"time"
	"unsafe"

	"github.com/rdt-project/rdt/core/engine"
	"github.com/rdt-project/rdt/core/transport"
)

//export rdtgo_put
func rdtgo_put(h C.uintptr_t, tensors *C.rdt_tensor, n C.size_t, transportName *C.char,
	release C.rdt_release_fn, userData C.uintptr_t, out *C.uintptr_t) C.int {
	return guard("rdt_put", func() error {
		return put(h, tensors, n, transportName, release, userData, out, (*engine.Runtime).Put)
	})
}

//export rdtgo_expose
func rdtgo_expose(h C.uintptr_t, tensors *C.rdt_tensor, n C.size_t, transportName *C.char,
	release C.rdt_release_fn, userData C.uintptr_t, out *C.uintptr_t) C.int {
	return guard("rdt_expose", func() error {
		return put(h, tensors, n, transportName, release, userData, out, (*engine.Runtime).Expose)
	})
}

// put converts rdt_put's and rdt_expose's arguments and makes the object
// with make.
func put(h C.uintptr_t, tensors *C.rdt_tensor, n C.size_t, transportName *C.char, release C.rdt_release_fn,
	userData C.uintptr_t, out *C.uintptr_t, make func(*engine.Runtime, []transport.Tensor, string, func()) (*engine.Ref, error)) error {
	rh, err := lookup[*runtimeHandle](h, "rt")
	if err != nil {
		return err
	}
	if out == nil {
		return invalid("out is NULL")
	}
	ts, err := tensorsFromC(tensors, n, "tensors")
	if err != nil {
		return err
	}
	var onFree func()
	switch queued := rh.rt.QueuesReleases(); {
	case queued && release != nil:
		return invalid("runtime %s queues releases (RDT_RUNTIME_QUEUE_RELEASES): pass release = NULL and take the user data with rdt_runtime_take_released()", rh.rt.Name())
	case queued && userData != 0:
		onFree = rh.rt.ReleaseToQueue(uintptr(userData))
	case release != nil:
		onFree = func() { C.rdtc_call_release(release, userData) }
	}
	ref, err := make(rh.rt, ts, goString(transportName), onFree)
	if err != nil {
		return err
	}
	*out = newHandle(&refHandle{ref: ref})
	return nil
}

//export rdtgo_ref_clone
func rdtgo_ref_clone(h C.uintptr_t, out *C.uintptr_t) C.int {
	return guardRef("rdt_ref_clone", h, "ref", func(ref *engine.Ref) error {
		if out == nil {
			return invalid("out is NULL")
		}
		c, err := ref.Clone()
		if err != nil {
			return err
		}
		*out = newHandle(&refHandle{ref: c})
		return nil
	})
}

//export rdtgo_ref_release
func rdtgo_ref_release(h C.uintptr_t) C.int {
	return guard("rdt_ref_release", func() error { return releaseRef(h, 0) })
}

//export rdtgo_ref_release_ex
func rdtgo_ref_release_ex(h C.uintptr_t, flags C.uint32_t) C.int {
	return guard("rdt_ref_release_ex", func() error { return releaseRef(h, flags) })
}

func releaseRef(h C.uintptr_t, flags C.uint32_t) error {
	if flags&^C.RDT_RELEASE_REVOKE_LEASES != 0 {
		return invalid("unknown flags %#x", uint32(flags))
	}
	ref, err := refOf(h, "ref")
	if err != nil {
		return err
	}
	release := ref.Release
	if flags&C.RDT_RELEASE_REVOKE_LEASES != 0 {
		release = ref.ReleaseRevokingLeases
	}
	if err := release(); err != nil {
		return err
	}
	deleteHandle(h)
	return nil
}

//export rdtgo_ref_serialize
func rdtgo_ref_serialize(h C.uintptr_t, outBytes *unsafe.Pointer, outSize *C.size_t) C.int {
	return guardRef("rdt_ref_serialize", h, "ref", func(ref *engine.Ref) error {
		if outBytes == nil || outSize == nil {
			return invalid("out_bytes and out_size must not be NULL")
		}
		b, err := ref.Serialize()
		if err != nil {
			return err
		}
		p := C.malloc(C.size_t(len(b)))
		if p == nil {
			return transport.Errorf(transport.ErrNoMemory, "out of memory for %d bytes", len(b))
		}
		copy(unsafe.Slice((*byte)(p), len(b)), b)
		*outBytes = p
		*outSize = C.size_t(len(b))
		return nil
	})
}

//export rdtgo_ref_deserialize
func rdtgo_ref_deserialize(h C.uintptr_t, bytes unsafe.Pointer, size C.size_t, ms C.int64_t, out *C.uintptr_t) C.int {
	return guardRuntime("rdt_ref_deserialize", h, func(rt *engine.Runtime) error {
		if out == nil {
			return invalid("out is NULL")
		}
		if bytes == nil {
			return invalid("bytes is NULL")
		}
		if size > engine.MaxRefSize {
			return transport.Errorf(transport.ErrCorrupt, "%d bytes is over the %d-byte limit of a serialized ref", size, engine.MaxRefSize)
		}
		b := C.GoBytes(bytes, C.int(size))
		ref, err := rt.DeserializeWithin(b, deserializeTimeout(ms))
		if err != nil {
			return err
		}
		*out = newHandle(&refHandle{ref: ref})
		return nil
	})
}

//export rdtgo_ref_info
func rdtgo_ref_info(h C.uintptr_t, out *C.rdt_object_info) C.int {
	return guardRef("rdt_ref_info", h, "ref", func(ref *engine.Ref) error {
		d := ref.Desc()
		out.num_tensors = C.uint32_t(len(d.Tensors))
		copyName(out.object_id[:], d.ID.String())
		copyName(out.transport[:], d.Transport)
		if ref.IsOwner() {
			out.is_owner = 1
		}
		if d.Writable {
			out.is_writable = 1
		}
		out.nbytes = C.uint64_t(d.Nbytes)
		return nil
	})
}

//export rdtgo_ref_tensor_info
func rdtgo_ref_tensor_info(h C.uintptr_t, index C.uint32_t, out *C.rdt_tensor_info) C.int {
	return guardRef("rdt_ref_tensor_info", h, "ref", func(ref *engine.Ref) error {
		d := ref.Desc()
		if int(index) >= len(d.Tensors) {
			return invalid("index %d is out of range (the object has %d tensors)", index, len(d.Tensors))
		}
		t := d.Tensors[index]
		out.ndim = C.int32_t(len(t.Shape))
		out.device.device_type = C.int32_t(t.Device.Type)
		out.device.device_id = C.int32_t(t.Device.ID)
		out.dtype.code = C.uint8_t(t.DType.Code)
		out.dtype.bits = C.uint8_t(t.DType.Bits)
		out.dtype.lanes = C.uint16_t(t.DType.Lanes)
		out.nbytes = C.uint64_t(t.Nbytes)
		for i, s := range t.Shape {
			out.shape[i] = C.int64_t(s)
		}
		return nil
	})
}

// deserializeTimeout is rdt_deserialize_options' timeout_ms: 0 is the
// default, negative no deadline of the caller's.
func deserializeTimeout(ms C.int64_t) time.Duration {
	switch {
	case ms < 0:
		return -1
	case ms == 0:
		return engine.DefaultDeserializeTimeout
	}
	return duration(ms)
}
