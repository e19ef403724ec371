package main

/*
#include "capi.h"
*/
import "C"

import (
	"github.com/rdt-project/rdt/core/control"
	"github.com/rdt-project/rdt/core/transport"
	"github.com/rdt-project/rdt/transports/cma"
	cudaipc "github.com/rdt-project/rdt/transports/cuda_ipc"
	"github.com/rdt-project/rdt/transports/nccl"
	"github.com/rdt-project/rdt/transports/nixl"
	"github.com/rdt-project/rdt/transports/shm"
	"github.com/rdt-project/rdt/transports/tcp"
)

// networkFor picks the control plane for a runtime's flags: sockets
// between processes unless the runtime is kept in-process.
func networkFor(flags uint32) control.Network {
	if flags&C.RDT_RUNTIME_IN_PROCESS != 0 {
		return control.InProcess{}
	}
	return control.Sockets{}
}

// builtinTransports are created in every new runtime. A factory whose
// library or hardware is missing here (cuda_ipc without libcuda, nixl
// without libnixl_capi.so, nccl without libnccl) reports ErrUnsupported and
// the runtime simply does not list it.
var builtinTransports = []transport.TransportFactory{
	cma.Factory(),
	shm.Factory(),
	tcp.Factory(),
	cudaipc.Factory(),
	nixl.Factory(),
	nccl.Factory(),
}
