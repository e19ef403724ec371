package nixl

import (
	"github.com/rdt-project/rdt/core/transport"
	"github.com/rdt-project/rdt/transports/internal/cuda"
)

// Settings are nixl's rows of the runtime's table of environment
// variables. They are read from the C environment (lib.go, nixl.go), which
// NIXL and UCX read themselves and a host may change after loading.
func Settings() []transport.Setting {
	return []transport.Setting{
		{Name: LibraryEnv, Type: "path", Default: "libnixl_capi.so", Where: "the NIXL loader, once per process (C environment)",
			Meaning: "NIXL's C API library the nixl transport opens", Bounds: "a loadable library"},
		{Name: "UCX_HANDLE_ERRORS", Type: "UCX's", Default: "set to none by rdt when unset", Where: "the NIXL loader, once per process (C environment)",
			Meaning: "UCX's fault handlers; rdt turns them off unless set, since they break the Go runtime", Bounds: "UCX's"},
		{Name: "UCX_TLS", Type: "UCX's", Default: "unset", Where: "the nixl transport, at each runtime creation (C environment)",
			Meaning: "UCX's transports; rdt warns when the list lacks shared memory", Bounds: "UCX's"},
		cuda.LibrarySetting,
	}
}
