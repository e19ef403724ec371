package nccl

import (
	"github.com/rdt-project/rdt/core/transport"
	"github.com/rdt-project/rdt/transports/internal/cuda"
)

// librarySetting is read by the NCCL loader (lib.go), once per process.
var librarySetting = transport.Setting{Name: "RDT_NCCL_LIBRARY", Type: "path", Default: "libnccl.so.2",
	Where: "the NCCL loader, once per process", Meaning: "the NCCL library the nccl transport and groups open", Bounds: "a loadable library"}

// teardownSetting bounds how long a group's destroy waits for NCCL.
var teardownSetting = transport.IntSetting{Name: "RDT_NCCL_TEARDOWN_MS", Default: 10000, Min: 0, Max: 3600000,
	Meaning: "how long rdt_group_destroy, and a runtime's destroy for all its groups, wait for NCCL to free a group's communicators; NCCL frees them once the group's other ranks on the host destroy theirs too, and goes on in the background past this wait"}

// Settings are nccl's rows of the runtime's table of environment
// variables: the loaders' library paths and the teardown's bound.
func Settings() []transport.Setting {
	return []transport.Setting{librarySetting, cuda.LibrarySetting, teardownSetting.Setting()}
}
