package nccl

import (
	"fmt"
	"testing"
	"unsafe"

	"github.com/rdt-project/rdt/core/transport"
	"github.com/rdt-project/rdt/core/transport/transporttest"
	"github.com/rdt-project/rdt/transports/internal/cuda"
	"golang.org/x/sys/unix"
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
	Ranks:      deviceMemory,
	LargeBytes: 64 << 20,
}

// deviceMemory is the memory of CUDA device rank. Copies go through
// mapped host memory (the race detector refuses Go memory addressed through
// uintptr).
func deviceMemory(rank int) transporttest.Memory {
	bounce := func(n int, f func(host []byte, addr uintptr) error) error {
		if n == 0 {
			return nil
		}
		h, err := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
		if err != nil {
			return err
		}
		defer unix.Munmap(h)
		return f(h, uintptr(unsafe.Pointer(&h[0])))
	}
	return transporttest.Memory{
		Device: transport.Device{Type: transport.DeviceCUDA, ID: int32(rank)},
		Alloc: func(n int) (uintptr, func(), error) {
			p, err := cuda.Alloc(rank, uint64(max(n, 1)))
			if err != nil {
				return 0, nil, err
			}
			return uintptr(p), func() { _ = cuda.Free(rank, p) }, nil
		},
		Write: func(addr uintptr, b []byte) error {
			return bounce(len(b), func(h []byte, hp uintptr) error {
				copy(h, b)
				return cuda.Memcpy(rank, cuda.Ptr(addr), cuda.Ptr(hp), uint64(len(b)))
			})
		},
		Read: func(addr uintptr, b []byte) error {
			return bounce(len(b), func(h []byte, hp uintptr) error {
				err := cuda.Memcpy(rank, cuda.Ptr(hp), cuda.Ptr(addr), uint64(len(b)))
				copy(b, h)
				return err
			})
		},
	}
}

func TestConformance(t *testing.T) { transporttest.Run(t, conformance) }
