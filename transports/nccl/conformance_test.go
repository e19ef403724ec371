package nccl

import (
	"testing"

	"github.com/rdt-project/rdt/core/transport/transporttest"
)

// nccl's communicator metadata goes through the suite's fuzz case. Its
// data cases need a group of two ranks, which a transport made on a bare
// host has not: gpu_process_test.go runs round trips, aborts, deadlines
// and killed ranks through whole runtimes on the NCCL double
// (`make fake-nccl-test`) or a GPU.
var conformance = transporttest.Config{
	New:    New,
	Decode: func(b []byte) error { _, err := decodeCMeta(b); return err },
	Unavailable: func() string {
		if err := Available(); err != nil {
			return err.Error()
		}
		return "nccl moves tensors only between the ranks of a group: gpu_process_test.go runs its data cases"
	},
}

func TestConformance(t *testing.T) { transporttest.Run(t, conformance) }
