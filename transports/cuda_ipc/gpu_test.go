package cudaipc

// Tests that need a CUDA device; they skip with "no CUDA device: <reason>"
// elsewhere. `make gpu-test` runs them.

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/rdt-project/rdt/core/transport"
	"github.com/rdt-project/rdt/core/transport/transporttest"
	"github.com/rdt-project/rdt/transports/internal/cuda"
)

const childEnv = "RDT_CUDA_IPC_CHILD"

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) == serveChild {
		serveMain()
		return
	}
	transporttest.Main(m, conformance)
}

func requireGPU(t testing.TB) {
	t.Helper()
	if why := cudaMissing(); why != "" {
		if os.Getenv("RDT_REQUIRE_GPU") == "1" {
			t.Fatalf("no CUDA device (RDT_REQUIRE_GPU=1): %s", why)
		}
		t.Skipf("no CUDA device: %s", why)
	}
}

func hostBuffer(t testing.TB, n int) []byte {
	b, err := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		panic(err)
	}
	if t != nil {
		t.Cleanup(func() { _ = unix.Munmap(b) })
	}
	return b
}

func hostAddr(b []byte) cuda.Ptr { return cuda.Ptr(uintptr(unsafe.Pointer(&b[0]))) }

func fill(b []byte, seed byte) {
	for i := range b {
		b[i] = byte(i*7) + seed
	}
}

func deviceTensor(p cuda.Ptr, n int) transport.Tensor {
	desc, err := transport.NewTensorDesc(transport.Device{Type: transport.DeviceCUDA, ID: 0}, transport.DType{Code: 1, Bits: 8, Lanes: 1}, []int64{int64(n)})
	if err != nil {
		panic(err)
	}
	return transport.Tensor{TensorDesc: desc, Data: uintptr(p), Orig: uintptr(p)}
}

// deviceBuffer allocates n bytes on device 0 (with room before and after,
// so tensors sit inside their allocation) filled with a pattern.
func deviceBuffer(t testing.TB, n int, seed byte) cuda.Ptr {
	p, err := cuda.Alloc(0, uint64(n)+8192)
	require.NoError(t, err)
	t.Cleanup(func() { _ = cuda.Free(0, p) })
	h := hostBuffer(t, n)
	fill(h, seed)
	require.NoError(t, cuda.Memcpy(0, p+4096, hostAddr(h), uint64(n)))
	return p + 4096
}

func readBack(t testing.TB, p cuda.Ptr, n int) []byte {
	h := hostBuffer(t, n)
	require.NoError(t, cuda.Memcpy(0, hostAddr(h), p, uint64(n)))
	return h
}

func gpuTransport(t testing.TB) *Transport {
	tr, err := New(newHost())
	require.NoError(t, err)
	t.Cleanup(func() { _ = tr.Close() })
	return tr.(*Transport)
}

func fetchWith(tr *Transport, x *transport.Transfer, meta []byte, targets []transport.Tensor) error {
	req, err := tr.Fetch(x, targets, meta, nil)
	if err != nil {
		return err
	}
	defer req.Release()
	return req.Wait()
}

func TestGPUSameProcess(t *testing.T) {
	requireGPU(t)
	tr := gpuTransport(t)
	const n = 1 << 20
	src := deviceBuffer(t, 2*n, 3)
	// Two tensors in one allocation: one handle in the metadata.
	meta, err := tr.ExtractMetadata(transport.ObjectID{}, []transport.Tensor{deviceTensor(src, n), deviceTensor(src+n, n)})
	require.NoError(t, err)
	m, err := decodeMetadata(meta)
	require.NoError(t, err)
	require.Len(t, m.Allocs, 1)
	assert.EqualValues(t, 4096, m.Tensors[0].Offset)
	assert.EqualValues(t, 4096+n, m.Tensors[1].Offset)

	dst := deviceBuffer(t, 2*n, 0)
	require.NoError(t, fetchWith(tr, &transport.Transfer{Transport: Name}, meta, []transport.Tensor{deviceTensor(dst, n), deviceTensor(dst+n, n)}))
	want := hostBuffer(t, 2*n)
	fill(want, 3)
	assert.True(t, bytes.Equal(want, readBack(t, dst, 2*n)))

	// Local copy (a runtime fetching its own object).
	dst2 := deviceBuffer(t, n, 0)
	require.NoError(t, tr.CopyLocal([]transport.Tensor{deviceTensor(dst2, n)}, []transport.Tensor{deviceTensor(src, n)}))
	assert.True(t, bytes.Equal(want[:n], readBack(t, dst2, n)))
}

func TestGPUHostMemoryIsRefused(t *testing.T) {
	requireGPU(t)
	tr := gpuTransport(t)
	h := hostBuffer(t, 4096)
	_, err := tr.ExtractMetadata(transport.ObjectID{}, []transport.Tensor{deviceTensor(hostAddr(h), 4096)})
	require.Error(t, err)
	t.Log(err)
}

// Memory that CUDA IPC cannot share is refused at put, with the allocator
// named and what to do instead, rather than with the driver's
// CUDA_ERROR_INVALID_VALUE from cuIpcGetMemHandle.
func TestGPUMemoryCUDAIPCCannotShare(t *testing.T) {
	requireGPU(t)
	tr := gpuTransport(t)
	const n = 1 << 20
	check := func(p cuda.Ptr, allocator string) {
		t.Helper()
		_, err := tr.ExtractMetadata(transport.ObjectID{}, []transport.Tensor{deviceTensor(p+4096, 4096)})
		require.Error(t, err)
		t.Log(err)
		assert.Equal(t, transport.ErrUnsupported, transport.StatusOf(err), "%v", err)
		assert.ErrorContains(t, err, "tensor 0 at")
		assert.ErrorContains(t, err, allocator)
		assert.ErrorContains(t, err, "which CUDA IPC cannot share; fetch it over another transport (nixl or nccl), or allocate it with plain cudaMalloc")
		assert.NotContains(t, err.Error(), "CUDA_ERROR", "the driver's refusal is explained, not passed on")
	}
	missing := func(err error) bool {
		var ce *cuda.Error
		return errors.As(err, &ce) && ce.Code == cuda.ErrorMissingCall && !testDouble()
	}
	if p, err := cuda.AllocAsync(0, n); !missing(err) {
		require.NoError(t, err)
		check(p, "backend:cudaMallocAsync")
		require.NoError(t, cuda.FreeAsync(0, p))
	}
	if p, size, err := cuda.AllocVMM(0, n); !missing(err) {
		require.NoError(t, err)
		check(p, "expandable_segments:True")
		require.NoError(t, cuda.FreeVMM(0, p, size))
	}
}

func TestGPUWrongDeviceOrdinal(t *testing.T) {
	requireGPU(t)
	n, _ := cuda.DeviceCount()
	tr := gpuTransport(t)
	src := deviceBuffer(t, 4096, 1)
	x := deviceTensor(src, 4096)
	x.Device.ID = int32(n) // no such device
	_, err := tr.ExtractMetadata(transport.ObjectID{}, []transport.Tensor{x})
	require.Error(t, err)
	t.Log(err)
	// Invalid, not unsupported: core would try another transport.
	assert.Equal(t, transport.ErrInvalidArgument, transport.StatusOf(err))
	assert.ErrorContains(t, err, fmt.Sprintf("tensor 0 is on cuda:%d, but this process sees %d CUDA device(s)", n, n))

	// A target on no device, in a fetch and in a local copy.
	meta, err := tr.ExtractMetadata(transport.ObjectID{}, []transport.Tensor{deviceTensor(src, 4096)})
	require.NoError(t, err)
	err = fetchWith(tr, &transport.Transfer{Transport: Name}, meta, []transport.Tensor{x})
	assert.Equal(t, transport.ErrInvalidArgument, transport.StatusOf(err), "%v", err)
	assert.ErrorContains(t, err, fmt.Sprintf("target 0 is on cuda:%d", n))
	err = tr.CopyLocal([]transport.Tensor{x}, []transport.Tensor{deviceTensor(src, 4096)})
	assert.Equal(t, transport.ErrInvalidArgument, transport.StatusOf(err), "%v", err)
	assert.ErrorContains(t, err, fmt.Sprintf("target 0 is on cuda:%d", n))
}

func TestGPUTwoDevices(t *testing.T) {
	requireGPU(t)
	if n, _ := cuda.DeviceCount(); n < 2 {
		t.Skip("needs two CUDA devices")
	}
	tr := gpuTransport(t)
	src := deviceBuffer(t, 4096, 1)
	meta, err := tr.ExtractMetadata(transport.ObjectID{}, []transport.Tensor{deviceTensor(src, 4096)})
	require.NoError(t, err)
	p, err := cuda.Alloc(1, 4096)
	require.NoError(t, err)
	defer cuda.Free(1, p)
	dst := deviceTensor(p, 4096)
	dst.Device.ID = 1
	err = fetchWith(tr, &transport.Transfer{Transport: Name}, meta, []transport.Tensor{dst})
	if can, _ := cuda.CanAccessPeer(1, 0); can {
		require.NoError(t, err)
	} else {
		require.Error(t, err)
		assert.Contains(t, err.Error(), "cuda:0")
		assert.Contains(t, err.Error(), "cuda:1")
	}
}

func TestGPUAnotherProcess(t *testing.T) {
	requireGPU(t)
	const n = 64 << 20
	src := transporttest.StartSource(t, n)
	meta := src.Meta
	tr := gpuTransport(t)
	x := &transport.Transfer{Transport: Name}
	x.Source.RuntimeID[0] = 1
	dst := deviceBuffer(t, n, 0)
	require.NoError(t, fetchWith(tr, x, meta, []transport.Tensor{deviceTensor(dst, n)}))
	want := src.Want[0]
	assert.True(t, bytes.Equal(want, readBack(t, dst, n)))
	assert.Equal(t, 1, tr.cache.len(), "the mapping stays cached")
	// Again: from the cache.
	dst2 := deviceBuffer(t, n, 0)
	require.NoError(t, fetchWith(tr, x, meta, []transport.Tensor{deviceTensor(dst2, n)}))
	assert.True(t, bytes.Equal(want, readBack(t, dst2, n)))

	// Abort: Wait returns promptly; Release waits for the copy.
	req, err := tr.Fetch(x, []transport.Tensor{deviceTensor(dst, n)}, meta, nil)
	require.NoError(t, err)
	tr.Abort(x, req)
	err = req.Wait()
	if err != nil {
		assert.Equal(t, transport.ErrAborted, transport.StatusOf(err))
	}
	req.Release()
	assert.True(t, req.(*request).Completed())
}
