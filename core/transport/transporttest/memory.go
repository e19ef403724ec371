package transporttest

import (
	"testing"
	"unsafe"

	"github.com/rdt-project/rdt/core/transport"
	"golang.org/x/sys/unix"
)

// Memory is where the suite puts tensors: host memory for most transports,
// device memory for the ones that move only that.
type Memory struct {
	// Device is what the tensors are described as.
	Device transport.Device
	// Alloc returns n bytes (n may be 0) and how to free them.
	Alloc func(n int) (addr uintptr, free func(), err error)
	// Write copies b to addr; Read copies from addr into b.
	Write func(addr uintptr, b []byte) error
	Read  func(addr uintptr, b []byte) error
}

// HostMemory maps buffers outside the Go heap (the race detector's pointer
// checks refuse Go memory addressed through uintptr).
func HostMemory() Memory {
	return Memory{
		Device: transport.Device{Type: transport.DeviceCPU},
		Alloc: func(n int) (uintptr, func(), error) {
			b, err := unix.Mmap(-1, 0, max(n, 1), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
			if err != nil {
				return 0, nil, err
			}
			return uintptr(unsafe.Pointer(&b[0])), func() { _ = unix.Munmap(b) }, nil
		},
		Write: func(addr uintptr, b []byte) error { copy(transport.Bytes(addr, uint64(len(b))), b); return nil },
		Read:  func(addr uintptr, b []byte) error { copy(b, transport.Bytes(addr, uint64(len(b)))); return nil },
	}
}

// Buffer maps n bytes of host memory for the test and describes them as a
// one-dimensional uint8 tensor on the CPU.
func Buffer(t testing.TB, n int) ([]byte, transport.Tensor) {
	t.Helper()
	b, err := unix.Mmap(-1, 0, max(n, 1), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Munmap(b) })
	addr := uintptr(unsafe.Pointer(&b[0]))
	return b[:n], Describe(transport.Device{Type: transport.DeviceCPU}, Uint8, addr, n)
}

// Buffers is a Buffer of each size: the tensors, and their bytes.
func Buffers(t testing.TB, sizes ...int) ([]transport.Tensor, [][]byte) {
	t.Helper()
	var tensors []transport.Tensor
	var bufs [][]byte
	for _, n := range sizes {
		b, x := Buffer(t, n)
		tensors = append(tensors, x)
		bufs = append(bufs, b)
	}
	return tensors, bufs
}

// Filled is Buffers with tensor i filled with Fill's pattern of seed+i.
func Filled(t testing.TB, seed byte, sizes ...int) ([]transport.Tensor, [][]byte) {
	t.Helper()
	tensors, bufs := Buffers(t, sizes...)
	for i, b := range bufs {
		Fill(b, seed+byte(i))
	}
	return tensors, bufs
}

// Dtypes the suite uses.
var (
	Uint8   = transport.DType{Code: 1, Bits: 8, Lanes: 1}
	Int64   = transport.DType{Code: 0, Bits: 64, Lanes: 1}
	Float32 = transport.DType{Code: 2, Bits: 32, Lanes: 1}
	Float64 = transport.DType{Code: 2, Bits: 64, Lanes: 1}
)

// Describe makes a one-dimensional tensor of nbytes bytes of dt at addr
// (nbytes must be a multiple of dt's size).
func Describe(dev transport.Device, dt transport.DType, addr uintptr, nbytes int) transport.Tensor {
	elem := int(dt.Bits) * int(dt.Lanes) / 8
	desc, err := transport.NewTensorDesc(dev, dt, []int64{int64(nbytes / elem)})
	if err != nil {
		panic(err)
	}
	return transport.Tensor{TensorDesc: desc, Data: addr, Orig: addr}
}

// Fill writes the suite's pattern, which differs per seed and per 4 KiB
// page, so that bytes landing at the wrong offset are noticed.
func Fill(b []byte, seed byte) {
	for i := range b {
		b[i] = byte(i*13) ^ seed ^ byte(i>>12)
	}
}

// Pattern returns n bytes of Fill's pattern.
func Pattern(n int, seed byte) []byte {
	b := make([]byte, n)
	Fill(b, seed)
	return b
}
