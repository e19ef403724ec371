package main

/*
#include "capi.h"
*/
import "C"

import (
	"github.com/rdt-project/rdt/core/engine"
)

// preparedHandle is what an rdt_prepared* names.
type preparedHandle struct{ p *engine.Prepared }

func newPrepared(p *engine.Prepared) any { return &preparedHandle{p: p} }

//export rdtgo_prepare_get
func rdtgo_prepare_get(h C.uintptr_t, refs *C.uintptr_t, nrefs C.size_t, targets *C.rdt_tensor,
	ntargets C.size_t, copts *C.rdt_get_options, out *C.uintptr_t) C.int {
	return openCall("rdt_prepare_get", h, refs, nrefs, targets, ntargets, copts, out, targetArgs,
		(*engine.Runtime).PrepareFetch, newPrepared)
}

//export rdtgo_prepare_write
func rdtgo_prepare_write(h C.uintptr_t, refs *C.uintptr_t, nrefs C.size_t, sources *C.rdt_tensor,
	nsources C.size_t, copts *C.rdt_write_options, out *C.uintptr_t) C.int {
	return openCall("rdt_prepare_write", h, refs, nrefs, sources, nsources, copts, out, writeArgs,
		(*engine.Runtime).PrepareWrite, newPrepared)
}

//export rdtgo_prepared_run
func rdtgo_prepared_run(h C.uintptr_t, tag C.uint64_t, ms C.int64_t) C.int {
	return guardOn("rdt_prepared_run", h, "prepared", func(ph *preparedHandle) error {
		return ph.p.Run(uint64(tag), duration(ms))
	})
}

//export rdtgo_prepared_free
func rdtgo_prepared_free(h C.uintptr_t) C.int {
	return guardFree("rdt_prepared_free", h, "prepared", func(ph *preparedHandle) error {
		ph.p.Close()
		return nil
	})
}
