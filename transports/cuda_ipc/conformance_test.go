package cudaipc

import (
	"testing"

	"github.com/rdt-project/rdt/core/transport"
	"github.com/rdt-project/rdt/core/transport/transporttest"
	"github.com/rdt-project/rdt/transports/internal/cuda"
	"golang.org/x/sys/unix"
)

// deviceMemory puts the suite's tensors on CUDA device 0, copying through
// mapped host buffers.
var deviceMemory = transporttest.Memory{
	Device: transport.Device{Type: transport.DeviceCUDA},
	Alloc: func(n int) (uintptr, func(), error) {
		p, err := cuda.Alloc(0, uint64(max(n, 1)))
		if err != nil {
			return 0, nil, err
		}
		return uintptr(p), func() { _ = cuda.Free(0, p) }, nil
	},
	Write: func(addr uintptr, b []byte) error {
		return throughHost(len(b), func(h []byte) error {
			copy(h, b)
			return cuda.Memcpy(0, cuda.Ptr(addr), hostAddr(h), uint64(len(b)))
		})
	},
	Read: func(addr uintptr, b []byte) error {
		return throughHost(len(b), func(h []byte) error {
			if err := cuda.Memcpy(0, hostAddr(h), cuda.Ptr(addr), uint64(len(b))); err != nil {
				return err
			}
			copy(b, h)
			return nil
		})
	},
}

// throughHost runs f on a mapped host buffer of n bytes (nothing for 0).
func throughHost(n int, f func([]byte) error) error {
	if n == 0 {
		return nil
	}
	h, err := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return err
	}
	defer unix.Munmap(h)
	return f(h)
}

// The cases run on a CUDA device: `make fake-gpu-test` gives them the
// project's double of the CUDA driver, `make gpu-test` a real one.
var conformance = transporttest.Config{
	New:    New,
	Memory: deviceMemory,
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
