package main

/*
#include "capi.h"
*/
import "C"

import (
	"unsafe"

	"github.com/rdt-project/rdt/core/engine"
)

//export rdtgo_runtime_take_released
func rdtgo_runtime_take_released(h C.uintptr_t, userData *C.uintptr_t, capacity C.size_t,
	count *C.size_t, timeoutMS C.int64_t) C.int {
	return guardRuntime("rdt_runtime_take_released", h, func(rt *engine.Runtime) error {
		if userData == nil || count == nil {
			return invalid("user_data and count must not be NULL")
		}
		if capacity == 0 {
			return invalid("capacity is 0")
		}
		if !rt.QueuesReleases() {
			return invalid("runtime %s was not created with RDT_RUNTIME_QUEUE_RELEASES: its release callbacks are called instead", rt.Name())
		}
		buf := make([]uintptr, min(capacity, engine.MaxTakeReleased))
		timeout := duration(timeoutMS)
		got, err := rt.TakeReleased(buf, timeout)
		if err != nil {
			return err
		}
		dst := unsafe.Slice((*uintptr)(unsafe.Pointer(userData)), got) // C's void *[], read as integers
		copy(dst, buf[:got])
		*count = C.size_t(got)
		return nil
	})
}
