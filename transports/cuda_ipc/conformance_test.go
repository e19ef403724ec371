package cudaipc

import (
	"testing"

	"github.com/rdt-project/rdt/core/transport/transporttest"
	"github.com/rdt-project/rdt/transports/internal/cuda/cudatest"
)

// The cases run on a CUDA device: `make fake-gpu-test` gives them the
// project's double of the CUDA driver, `make gpu-test` a real one.
var conformance = transporttest.Config{
	New:    New,
	Memory: cudatest.Memory(0),
	Decode: func(b []byte) error { _, err := decodeMetadata(b); return err },
	Unavailable: func() string {
		if why := cudaMissing(); why != "" {
			return "no CUDA device (make fake-gpu-test runs these on the CUDA driver double): " + why
		}
		return ""
	},
	LargeBytes: 64 << 20,
	WriterLandsBytes: "cuda_ipc writes through the owner's IPC handles into its device memory: the owner's " +
		"runtime takes no part in them",
	TrustsSourceProcess: "cuda_ipc opens the IPC handle its metadata carries without checking the process it names " +
		"(the driver refuses handles of another node, and the engine keeps same-host transports to their host)",
}

func TestConformance(t *testing.T) { transporttest.Run(t, conformance) }
