package main

/*
#include "capi.h"
*/
import "C"

import (
	"github.com/rdt-project/rdt/core"
	"github.com/rdt-project/rdt/transports/cma"
	"github.com/rdt-project/rdt/transports/nixl"
	"github.com/rdt-project/rdt/transports/shm"
	"github.com/rdt-project/rdt/transports/tcp"
)

// networkFor picks the control plane for a runtime's flags: sockets
// between processes unless the runtime is kept in-process.
func networkFor(flags uint32) core.Network {
	if flags&C.RDT_RUNTIME_IN_PROCESS != 0 {
		return core.InProcess{}
	}
	return core.Sockets{}
}

// builtinTransports are created in every new runtime. Those whose library
// is missing (nixl without libnixl_capi.so) are skipped.
var builtinTransports = []core.TransportFactory{
	cma.Factory(),
	shm.Factory(),
	tcp.Factory(),
	nixl.Factory(),
}
