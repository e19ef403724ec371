package cudaipc

import (
	"github.com/rdt-project/rdt/core/transport"
	"github.com/rdt-project/rdt/transports/internal/cuda"
)

// The environment variables cuda_ipc reads, through Host.Settings (and the
// driver's library path, which the shared CUDA loader reads).
var (
	cacheSetting = transport.IntSetting{Name: "RDT_CUDA_IPC_CACHE", Default: 64, Min: 0, Max: 1 << 20,
		Where:   "runtime (the first runtime with cuda_ipc sizes the process's cache)",
		Meaning: "opened CUDA IPC handles cuda_ipc keeps per process"}
	// visibleDevicesSetting is the driver's own; only quoted in errors
	// about device ordinals.
	visibleDevicesSetting = transport.Setting{Name: "CUDA_VISIBLE_DEVICES", Type: "device list", Default: "unset (every device)",
		Where: transport.ReadAtRuntime, Meaning: "the CUDA driver's device mask; rdt only quotes it in errors about device ordinals",
		Bounds: "the driver's syntax (not checked by rdt)", KeepEmpty: true, Check: func(string) error { return nil }}
)

// Settings are cuda_ipc's rows of the runtime's table of environment
// variables.
func Settings() []transport.Setting {
	return []transport.Setting{cacheSetting.Setting(), visibleDevicesSetting, cuda.LibrarySetting}
}
