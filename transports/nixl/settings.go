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
		{Name: "UCX_CUDA_IPC_ENABLE_GET_ZCOPY", Type: "UCX's", Default: "set to y by rdt when unset, where the CUDA driver sees a GPU", Where: "the NIXL loader, once per process (C environment)",
			Meaning: "UCX's cuda_ipc reads (get_zcopy), which a nixl fetch of device memory on one host needs; UCX leaves them off on GPUs without an active NVLink (tcp moves the bytes then), rdt turns them on unless set", Bounds: "UCX's (y, n or auto)"},
		ucxTimeout("UCX_TCP_USER_TIMEOUT", "the peer timeout", "how long UCX's tcp keeps data unacknowledged before it gives the connection up"),
		ucxTimeout("UCX_TCP_KEEPIDLE", "half the peer timeout, in whole seconds (1 at least)", "how long a UCX tcp connection that receives nothing waits before it probes"),
		ucxTimeout("UCX_TCP_KEEPINTVL", "a quarter of the peer timeout, in whole seconds (1 at least)", "the interval between UCX's tcp keepalive probes"),
		ucxTimeout("UCX_TCP_KEEPCNT", "the probes that fill the rest of the peer timeout (1 at least)", "unanswered probes before UCX's tcp gives the connection up"),
		{Name: "UCX_TLS", Type: "UCX's", Default: "unset", Where: "the nixl transport, at each runtime creation (C environment)",
			Meaning: "UCX's transports; rdt warns when the list lacks shared memory", Bounds: "UCX's"},
		cuda.LibrarySetting,
	}
}

// ucxTimeout is a row of the UCX tcp timeouts rdt sets from the peer
// timeout (setTCPTimeouts), so that a silent link fails a nixl transfer
// as soon as it fails rdt's own connections.
func ucxTimeout(name, value, meaning string) transport.Setting {
	return transport.Setting{Name: name, Type: "UCX's", Default: "unset: rdt sets " + value,
		Where: "the first nixl transport of the process (C environment)", Meaning: meaning, Bounds: "UCX's"}
}
