package main

/*
#include "capi.h"
*/
import "C"

import "github.com/rdt-project/rdt/core"

// networkFor picks the control plane for a runtime's flags.
func networkFor(flags uint32) core.Network {
	return core.InProcess{}
}

// builtinTransports are created in every new runtime.
var builtinTransports []core.TransportFactory
