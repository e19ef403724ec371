package nccl

import (
	"github.com/rdt-project/rdt/core/transport"
	"github.com/rdt-project/rdt/transports/internal/cuda"
)

// librarySetting is read by the NCCL loader (lib.go), once per process.
var librarySetting = transport.Setting{Name: "RDT_NCCL_LIBRARY", Type: "path", Default: "libnccl.so.2",
	Where: "the NCCL loader, once per process", Meaning: "the NCCL library the nccl transport and groups open", Bounds: "a loadable library"}

// Settings are nccl's rows of the runtime's table of environment
// variables: the loaders' library paths.
func Settings() []transport.Setting { return []transport.Setting{librarySetting, cuda.LibrarySetting} }
