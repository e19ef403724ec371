package cuda

import "github.com/rdt-project/rdt/core/transport"

// LibrarySetting is the driver library's path, read by Library once per
// process; every transport that opens the driver lists it among its
// settings.
var LibrarySetting = transport.Setting{Name: "RDT_CUDA_LIBRARY", Type: "path", Default: DefaultLibrary,
	Where: "the CUDA driver loader, once per process", Meaning: "the CUDA driver library cuda_ipc, nixl and nccl open", Bounds: "a loadable library"}
