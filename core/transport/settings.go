package transport

// Settings are the tunables a built-in transport reads, parsed and checked
// by the engine from the environment when the runtime is created (the
// table is core's, documented in docs/configuration.md). Transports take
// them from Host.Settings and never read the environment themselves.
type Settings struct {
	// TCPStreams is how many connections one large tcp fetch is split
	// over (RDT_TCP_STREAMS).
	TCPStreams int
	// CMAWorkers is how many threads one cma fetch copies with
	// (RDT_CMA_WORKERS).
	CMAWorkers int
	// CMASetPtracer lets same-user processes read this one under Yama
	// ptrace_scope 1 (RDT_CMA_SET_PTRACER).
	CMASetPtracer bool
	// SHMArenaMiB is the size of the segment shm stages small objects in,
	// 0 for none (RDT_SHM_ARENA_MIB).
	SHMArenaMiB int
	// CUDAIPCCache is how many opened IPC handles cuda_ipc keeps per
	// process (RDT_CUDA_IPC_CACHE).
	CUDAIPCCache int
	// CUDAVisibleDevices is the CUDA driver's device mask, quoted in
	// errors about device ordinals; CUDAVisibleDevicesSet tells an empty
	// mask (no device) from none.
	CUDAVisibleDevices    string
	CUDAVisibleDevicesSet bool
}

// Defaults and bounds of Settings, shared by the engine's table and the
// transports' tests.
const (
	DefaultTCPStreams   = 4
	MaxTCPStreams       = 16
	DefaultCMAWorkers   = 2
	MaxCMAWorkers       = 4
	DefaultSHMArenaMiB  = 64
	MaxSHMArenaMiB      = 4096
	DefaultCUDAIPCCache = 64
	MaxCUDAIPCCache     = 1 << 20
)

// DefaultSettings are the settings of an environment that sets nothing.
func DefaultSettings() Settings {
	return Settings{TCPStreams: DefaultTCPStreams, CMAWorkers: DefaultCMAWorkers,
		CMASetPtracer: true, SHMArenaMiB: DefaultSHMArenaMiB, CUDAIPCCache: DefaultCUDAIPCCache}
}
