package nixl

/*
#cgo CFLAGS: -g -O2 -Wall
#cgo LDFLAGS: -ldl -lpthread
#include <stdlib.h>
#include "shim.h"
*/
import "C"

import (
	"os"
	"strings"
	"sync"
	"unsafe"

	"github.com/rdt-project/rdt/core/transport"
)

// LibraryEnv names the environment variable that points at libnixl_capi.so.
const LibraryEnv = "RDT_NIXL_LIBRARY"

// defaultLibrary is found through the dynamic loader's search path.
const defaultLibrary = "libnixl_capi.so"

var (
	loadMu   sync.Mutex
	loaded   string // the path loaded, once it worked
	loadErrs = map[string]error{}
)

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
	if p, _ := cgetenv(LibraryEnv); p != "" {
		return p
	}
	return defaultLibrary
}

// prepareEnv sets what NIXL's bundled UCX needs to coexist with Go before
// the library starts: UCX's own SIGSEGV/SIGBUS handlers (installed without
// SA_ONSTACK by older UCX releases) break the Go runtime, so error handling
// is left to Go unless the user chose otherwise.
func prepareEnv() {
	if _, ok := cgetenv("UCX_HANDLE_ERRORS"); !ok {
		os.Setenv("UCX_HANDLE_ERRORS", "none") // with cgo this sets the C environment too
	}
}

// Load opens NIXL's C API library (once per process) and resolves the
// functions this transport calls. A missing library or symbol is
// transport.ErrUnsupported with the path and the reason.
func Load() error {
	path := libraryPath()
	loadMu.Lock()
	defer loadMu.Unlock()
	if loaded != "" {
		if loaded != path {
			return transport.Errorf(transport.ErrUnsupported, "%s is already loaded in this process; cannot also load %s", loaded, path)
		}
		return nil
	}
	if err, ok := loadErrs[path]; ok {
		return err
	}
	prepareEnv()
	err := open(path, false)
	if err == nil {
		loaded = path
		return nil
	}
	loadErrs[path] = err
	return err
}

// open loads (or, with probe, only checks) the library at path.
func open(path string, probe bool) error {
	cpath := C.CString(path)
	defer C.free(unsafe.Pointer(cpath))
	var what *C.char
	var rc C.int
	if probe {
		rc = C.rdtnx_probe(cpath, &what)
	} else {
		rc = C.rdtnx_load(cpath, &what)
	}
	var err error
	switch rc {
	case 0:
		return nil
	case 1:
		err = transport.Errorf(transport.ErrUnsupported, "cannot load NIXL's C API library %s (set %s to its path, e.g. the libnixl_capi.so of the nixl wheel): %s",
			path, LibraryEnv, strings.TrimSpace(C.GoString(what)))
	case 3:
		err = transport.Errorf(transport.ErrUnsupported, "%s is NIXL's reworked C API (version %s), whose agent configuration and buffer ownership differ from the C API of nixl 1.5.1 that rdt speaks; point %s at the libnixl_capi.so of the nixl-cu12 1.5.1 wheel",
			path, C.GoString(what), LibraryEnv)
	default:
		err = transport.Errorf(transport.ErrUnsupported, "%s lacks the symbol %s (not NIXL's C API library, or an incompatible release)", path, C.GoString(what))
	}
	C.free(unsafe.Pointer(what))
	return err
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
