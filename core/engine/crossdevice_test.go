package engine

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rdt-project/rdt/core/transport"
)

// "CUDA memory" in these tests is host memory described as CUDA: the
// engine's decisions depend on the description, and the copier below (in
// place of cuda_ipc's) copies it as host memory.

// hostCopier is a transport that only copies "CUDA" memory within a
// process, as cuda_ipc's CopyLocal does.
type hostCopier struct {
	*memTransport
	copies atomic.Int64
}

func newHostCopier() *hostCopier {
	c := &hostCopier{memTransport: newMemTransport("devcopy")}
	c.describe = func(d *transport.Descriptor) { d.Devices = []transport.DeviceType{transport.DeviceCUDA} }
	return c
}

func (c *hostCopier) CopyLocal(dst, src []transport.Tensor) error {
	c.copies.Add(1)
	for i := range src {
		copy(transport.Bytes(dst[i].Data, dst[i].Nbytes), transport.Bytes(src[i].Data, src[i].Nbytes))
	}
	return nil
}

func onDevice(t transport.Tensor, d transport.DeviceType) transport.Tensor {
	t.Device = transport.Device{Type: d}
	return t
}

func TestHostIntoCUDAIsStagedThroughHostMemory(t *testing.T) {
	p := rangedPair(t)
	copier := newHostCopier()
	require.NoError(t, p.borrower.RegisterTransport(copier))
	refs, src := p.share(t, 1, 1<<16, "mem")
	out := newHostBuf(t, 1<<16)
	target := onDevice(tensorOf(t, out), transport.DeviceCUDA)
	require.NoError(t, p.borrower.Get(refs, []transport.Tensor{target}, FetchOptions{}, 5*time.Second))
	assert.Equal(t, src[0].b, out.b)
	assert.Equal(t, int64(1), copier.copies.Load(), "one copy of the staged bytes")

	// A partial fetch of the last KiB, staged the same way.
	last := newHostBuf(t, 1024)
	sources := []Range{{Piece: transport.Piece{Offset: 1<<16 - 1024, Length: RestOfTensor}}}
	require.NoError(t, p.borrower.Get(refs, []transport.Tensor{onDevice(tensorOf(t, last), transport.DeviceCUDA)}, FetchOptions{Sources: sources}, 5*time.Second))
	assert.Equal(t, src[0].b[1<<16-1024:], last.b)
}

func TestHostIntoCUDANeedsACopier(t *testing.T) {
	p := newPair(t, nil)
	refs, _ := p.share(t, 1, 4096, "mem")
	out := newHostBuf(t, 4096)
	err := p.borrower.Get(refs, []transport.Tensor{onDevice(tensorOf(t, out), transport.DeviceCUDA)}, FetchOptions{}, 5*time.Second)
	require.Error(t, err)
	assert.Equal(t, transport.ErrUnsupported, transport.StatusOf(err))
	assert.Contains(t, err.Error(), "needs a transport that can (cuda_ipc")
	assert.Equal(t, int64(0), p.dst.fetched.Load())
}

// cudaPair shares an object of one "CUDA" tensor over a transport that
// moves CUDA memory and, with direct, lands it in host memory too.
func cudaPair(t *testing.T, direct bool) (*pair, []*Ref, []*hostBuf) {
	p := newPair(t, func(m *memTransport) {
		m.describe = func(d *transport.Descriptor) {
			d.Devices = []transport.DeviceType{transport.DeviceCUDA}
			if direct {
				d.CrossDevice = []transport.DevicePair{{Source: transport.DeviceCUDA, Target: transport.DeviceCPU}}
			}
		}
	})
	buf := newHostBuf(t, 8192)
	buf.fill(4)
	borrowed := p.lend(t, []transport.Tensor{onDevice(tensorOf(t, buf), transport.DeviceCUDA)}, "mem")
	return p, []*Ref{borrowed}, []*hostBuf{buf}
}

func TestCUDAIntoHostOverATransportThatLandsIt(t *testing.T) {
	p, refs, src := cudaPair(t, true)
	out := newHostBuf(t, 8192)
	require.NoError(t, p.borrower.Get(refs, []transport.Tensor{tensorOf(t, out)}, FetchOptions{}, 5*time.Second))
	assert.Equal(t, src[0].b, out.b)
}

func TestCUDAIntoHostIsRefusedByATransportThatCannot(t *testing.T) {
	p, refs, _ := cudaPair(t, false)
	out := newHostBuf(t, 8192)
	err := p.borrower.Get(refs, []transport.Tensor{tensorOf(t, out)}, FetchOptions{}, 5*time.Second)
	require.Error(t, err)
	assert.Equal(t, transport.ErrUnsupported, transport.StatusOf(err))
	assert.Contains(t, err.Error(), "does not receive cuda memory into cpu memory")
	assert.Equal(t, int64(0), p.dst.fetched.Load())
}

func TestReceiveAcrossOtherDevicesIsInvalid(t *testing.T) {
	p := newPair(t, nil)
	refs, _ := p.share(t, 1, 4096, "mem")
	out := newHostBuf(t, 4096)
	err := p.borrower.Get(refs, []transport.Tensor{onDevice(tensorOf(t, out), transport.DeviceROCM)}, FetchOptions{}, 5*time.Second)
	require.Error(t, err)
	assert.Equal(t, transport.ErrInvalidArgument, transport.StatusOf(err))
	assert.Contains(t, err.Error(), "between host and CUDA memory only")
}

// An object a runtime owns is copied into another device type by the
// transport that copies that device's memory.
func TestLocalCopyAcrossDevices(t *testing.T) {
	rt := newRuntime(t, "solo")
	copier := newHostCopier()
	require.NoError(t, rt.RegisterTransport(copier))
	buf := newHostBuf(t, 4096)
	buf.fill(8)
	ref, err := rt.Put([]transport.Tensor{tensorOf(t, buf)}, "", nil)
	require.NoError(t, err)
	defer ref.Release()
	out := newHostBuf(t, 4096)
	require.NoError(t, rt.Get([]*Ref{ref}, []transport.Tensor{onDevice(tensorOf(t, out), transport.DeviceCUDA)}, FetchOptions{}, 5*time.Second))
	assert.Equal(t, buf.b, out.b)
	assert.Equal(t, int64(1), copier.copies.Load())
}
