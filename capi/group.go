package main

/*
#include "capi.h"
*/
import "C"

import (
	"github.com/rdt-project/rdt/core/engine"
	"github.com/rdt-project/rdt/core/transport"
)

//export rdtgo_group_create
func rdtgo_group_create(h C.uintptr_t, name *C.char, worldSize, rank C.int32_t, rank0 *C.char, device C.int32_t, backend *C.char, timeoutMs C.int64_t) C.int {
	return guardRuntime("rdt_group_create", h, func(rt *engine.Runtime) error {
		if name == nil {
			return invalid("name is NULL")
		}
		spec := transport.GroupSpec{
			Name: C.GoString(name), WorldSize: int(worldSize), Rank: int(rank),
			Rank0: goString(rank0), Device: int(device), Backend: goString(backend),
		}
		return rt.CreateGroup(spec, duration(timeoutMs))
	})
}

//export rdtgo_group_destroy
func rdtgo_group_destroy(h C.uintptr_t, name *C.char) C.int {
	return guardRuntime("rdt_group_destroy", h, func(rt *engine.Runtime) error {
		if name == nil {
			return invalid("name is NULL")
		}
		return rt.DestroyGroup(C.GoString(name))
	})
}
