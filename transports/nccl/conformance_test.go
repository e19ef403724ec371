package nccl

import (
	"fmt"
	"testing"

	"github.com/rdt-project/rdt/core/transport/transporttest"
	"github.com/rdt-project/rdt/transports/internal/cuda"
	"github.com/rdt-project/rdt/transports/internal/cuda/cudatest"
)

// nccl runs the suite's data cases in a group of two ranks, each on a
// device of its own (cuda:0 and cuda:1): on the NCCL and CUDA doubles
// (`make fake-nccl-test`) or on a machine with two GPUs. The behaviour
// beyond one transfer (groups destroyed on both sides, transfers in order,
// whole runtimes) is in gpu_process_test.go and gpu_test.go.
var conformance = transporttest.Config{
	New:    New,
	Decode: func(b []byte) error { _, err := decodeCMeta(b); return err },
	Unavailable: func() string {
		if err := Available(); err != nil {
			return err.Error()
		}
		if n, _ := cuda.DeviceCount(); n < 2 {
			return fmt.Sprintf("the cases need two CUDA devices, one per rank (this process sees %d)", n)
		}
		return ""
	},
	Ranks:      cudatest.Memory,
	LargeBytes: 64 << 20,
}

func TestConformance(t *testing.T) { transporttest.Run(t, conformance) }
