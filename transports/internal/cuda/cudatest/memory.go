// Package cudatest gives the GPU transports' tests the memory of a CUDA
// device for the transporttest suite.
package cudatest

import (
	"unsafe"

	"github.com/rdt-project/rdt/core/transport"
	"github.com/rdt-project/rdt/core/transport/transporttest"
	"github.com/rdt-project/rdt/transports/internal/cuda"
	"golang.org/x/sys/unix"
)

// Memory is the memory of CUDA device dev. Copies go through mapped host
// memory (the race detector refuses Go memory addressed through uintptr).
func Memory(dev int) transporttest.Memory {
	return transporttest.Memory{
		Device: transport.Device{Type: transport.DeviceCUDA, ID: int32(dev)},
		Alloc: func(n int) (uintptr, func(), error) {
			p, err := cuda.Alloc(dev, uint64(max(n, 1)))
			if err != nil {
				return 0, nil, err
			}
			return uintptr(p), func() { _ = cuda.Free(dev, p) }, nil
		},
		Write: func(addr uintptr, b []byte) error {
			return throughHost(len(b), func(h []byte, hp cuda.Ptr) error {
				copy(h, b)
				return cuda.Memcpy(dev, cuda.Ptr(addr), hp, uint64(len(b)))
			})
		},
		Read: func(addr uintptr, b []byte) error {
			return throughHost(len(b), func(h []byte, hp cuda.Ptr) error {
				if err := cuda.Memcpy(dev, hp, cuda.Ptr(addr), uint64(len(b))); err != nil {
					return err
				}
				copy(b, h)
				return nil
			})
		},
	}
}

// throughHost runs f on a mapped host buffer of n bytes and its address
// (nothing for 0).
func throughHost(n int, f func(h []byte, hp cuda.Ptr) error) error {
	if n == 0 {
		return nil
	}
	h, err := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return err
	}
	defer unix.Munmap(h)
	return f(h, cuda.Ptr(uintptr(unsafe.Pointer(&h[0]))))
}
