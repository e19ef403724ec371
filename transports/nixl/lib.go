package nixl

/*
#cgo CFLAGS: -g -O2 -Wall
#cgo LDFLAGS: -ldl -lpthread
#include <stdlib.h>
#include "shim.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"
	"unsafe"

	"github.com/rdt-project/rdt/core/transport"
	"github.com/rdt-project/rdt/transports/internal/cuda"
	"github.com/rdt-project/rdt/transports/internal/dynlib"
)

// LibraryEnv names the environment variable that points at libnixl_capi.so.
const LibraryEnv = "RDT_NIXL_LIBRARY"

// defaultLibrary is found through the dynamic loader's search path.
const defaultLibrary = "libnixl_capi.so"

// loader keeps the library loaded, or why each path tried failed.
var loader dynlib.ByPath

// cgetenv reads the C environment. A Go runtime in a shared library
// copied the environment when it started; a host that set a variable
// afterwards (Python's os.environ does) changed only the C one, which is
// also what NIXL and UCX read.
func cgetenv(name string) (string, bool) {
	cname := C.CString(name)
	defer C.free(unsafe.Pointer(cname))
	v := C.getenv(cname)
	if v == nil {
		return "", false
	}
	return C.GoString(v), true
}

// libraryPath is what Load opens: $RDT_NIXL_LIBRARY, else the loader's
// search path.
func libraryPath() string {
	p, _ := cgetenv(LibraryEnv)
	return dynlib.Path(p, defaultLibrary)
}

// prepareEnv sets, before the library starts, what NIXL's bundled UCX
// needs, leaving alone each variable the user set. UCX's own
// SIGSEGV/SIGBUS handlers (installed without SA_ONSTACK by older UCX
// releases) break the Go runtime, so error handling is left to Go; and
// where the CUDA driver sees a GPU, cuda_ipc reads are turned on
// (preferCudaIPCReads).
func prepareEnv() {
	if _, ok := cgetenv("UCX_HANDLE_ERRORS"); !ok {
		os.Setenv("UCX_HANDLE_ERRORS", "none") // with cgo this sets the C environment too
	}
	if n, err := cuda.DeviceCount(); err == nil && n > 0 {
		preferCudaIPCReads()
	}
}

// preferCudaIPCReads turns on UCX's cuda_ipc get_zcopy unless the user
// chose: a nixl fetch is a READ, which UCX's cuda_ipc serves with
// get_zcopy, and UCX leaves that off ("auto") on GPUs without an active
// NVLink, so device memory between processes of one host would go over
// tcp instead. Only where a GPU is: elsewhere UCX loads no cuda_ipc, and
// it warns on stdout about a UCX variable nothing reads.
func preferCudaIPCReads() {
	if _, ok := cgetenv("UCX_CUDA_IPC_ENABLE_GET_ZCOPY"); !ok {
		os.Setenv("UCX_CUDA_IPC_ENABLE_GET_ZCOPY", "y")
	}
}

// tcpTimeoutsOnce: UCX reads its settings from the C environment, which
// the whole process shares; the first runtime's peer timeout sets them.
var tcpTimeoutsOnce sync.Once

// setTCPTimeouts makes UCX's tcp connections fail as rdt's peer timeout
// does, for the settings the user left unset: without them a link that
// goes silent under a read is noticed only after the kernel's own
// timeouts (18 s measured, and longer with data in flight).
func setTCPTimeouts(peerTimeout time.Duration) {
	tcpTimeoutsOnce.Do(func() {
		user, idle, interval, count := tcpTimeouts(peerTimeout)
		// Each by its name: the configuration test holds loaders to the
		// variables they name (capi/config_test.go).
		if _, ok := cgetenv("UCX_TCP_USER_TIMEOUT"); !ok {
			os.Setenv("UCX_TCP_USER_TIMEOUT", user) // with cgo this sets the C environment too
		}
		if _, ok := cgetenv("UCX_TCP_KEEPIDLE"); !ok {
			os.Setenv("UCX_TCP_KEEPIDLE", idle)
		}
		if _, ok := cgetenv("UCX_TCP_KEEPINTVL"); !ok {
			os.Setenv("UCX_TCP_KEEPINTVL", interval)
		}
		if _, ok := cgetenv("UCX_TCP_KEEPCNT"); !ok {
			os.Setenv("UCX_TCP_KEEPCNT", count)
		}
	})
}

// tcpTimeouts are UCX's values for a peer timeout: unacknowledged data
// gives up after the timeout; a connection that receives nothing is probed
// after half of it and given up after the rest (the kernel counts
// keepalive in whole seconds, 1 s at least).
func tcpTimeouts(peerTimeout time.Duration) (user, idle, interval, count string) {
	secs := max(1, int(peerTimeout/time.Second))
	i := max(1, secs/2)
	n := max(1, secs/4)
	return fmt.Sprintf("%dms", peerTimeout.Milliseconds()), fmt.Sprintf("%ds", i), fmt.Sprintf("%ds", n),
		fmt.Sprint(max(1, (secs-i)/n))
}

// Load opens NIXL's C API library (once per process) and resolves the
// functions this transport calls. A missing library or symbol is
// transport.ErrUnsupported with the path and the reason.
func Load() error {
	path := libraryPath()
	return loader.Load(path, func() error {
		prepareEnv()
		return open(path, false)
	})
}

// open loads (or, with probe, only checks) the library at path. A library
// loaded stays open: NIXL's threads and UCX live as long as the process.
func open(path string, probe bool) error {
	syms := symbols()
	lib, fns, err := dynlib.OpenTable(syms, path)
	var missing *dynlib.MissingSymbolError
	switch {
	case errors.As(err, &missing):
		return transport.Errorf(transport.ErrUnsupported, "%s lacks the symbol %s (not NIXL's C API library, or an incompatible release)", path, missing.Symbol)
	case err != nil:
		return transport.Errorf(transport.ErrUnsupported, "cannot load NIXL's C API library %s (set %s to its path, e.g. the libnixl_capi.so of the nixl wheel): %s",
			path, LibraryEnv, strings.TrimSpace(err.Error()))
	}
	// NIXL's reworked C API (src/api/c/nixl_capi.h, newer than the pinned
	// 1.5.1) exports nixl_capi_get_version and is not the one declared in
	// shim.h (wrapper.h): its nixl_capi_agent_config_t has a 16-bit
	// listen_port, which moves thread_sync and the fields after it, and the
	// buffers it returns are freed with nixl_capi_mem_free. Refuse it rather
	// than have it read thread_sync from where listen_port is.
	if v := lib.Lookup("nixl_capi_get_version"); v != nil {
		var major, minor, patch C.int
		C.rdtnx_capi_version(v, &major, &minor, &patch)
		lib.Close()
		return transport.Errorf(transport.ErrUnsupported, "%s is NIXL's reworked C API (version %d.%d.%d), whose agent configuration and buffer ownership differ from the C API of nixl 1.5.1 that rdt speaks; point %s at the libnixl_capi.so of the nixl-cu12 1.5.1 wheel",
			path, int(major), int(minor), int(patch), LibraryEnv)
	}
	if probe {
		lib.Close()
		return nil
	}
	C.rdtnx_install(&fns[0])
	return nil
}

// symbols is the shim's table of NIXL functions, in its order.
func symbols() []dynlib.Symbol {
	var syms []dynlib.Symbol
	for i := 0; ; i++ {
		name := C.rdtnx_symbol(C.size_t(i))
		if name == nil {
			return syms
		}
		syms = append(syms, dynlib.Symbol{Name: C.GoString(name)})
	}
}

// status names a nixl_capi_status_t.
func statusName(st C.int) string {
	switch st {
	case 0:
		return "NIXL_CAPI_SUCCESS"
	case 1:
		return "NIXL_CAPI_IN_PROG"
	case -1:
		return "NIXL_CAPI_ERROR_INVALID_PARAM"
	case -2:
		return "NIXL_CAPI_ERROR_BACKEND"
	case -3:
		return "NIXL_CAPI_ERROR_INVALID_STATE"
	case -4:
		return "NIXL_CAPI_ERROR_EXCEPTION"
	case -5:
		return "NIXL_CAPI_ERROR_NO_TELEMETRY"
	case -6:
		return "NIXL_CAPI_ERROR_NOT_FOUND"
	}
	return "unknown status"
}

// callError describes a failed NIXL call.
func callError(code transport.Status, what string, call *C.char, st C.int) error {
	name := "NIXL"
	if call != nil {
		name = C.GoString(call)
	}
	return transport.Errorf(code, "%s: %s failed with status %d (%s)", what, name, int(st), statusName(st))
}
