package cudaipc

import (
	"github.com/rdt-project/rdt/core/transport"
	"github.com/rdt-project/rdt/transports/internal/cuda"
)

// ExtractMetadata exports an IPC handle of every allocation holding the
// tensors and records where in it each tensor lies.
func (t *Transport) ExtractMetadata(obj transport.ObjectID, tensors []transport.Tensor) ([]byte, error) {
	m := metadata{Pid: uint32(t.pid), Token: procToken}
	byBuffer := map[uint64]uint32{}
	for i, x := range tensors {
		if x.Device.Type != transport.DeviceCUDA {
			return nil, transport.Errorf(transport.ErrUnsupported, "it moves CUDA device memory; tensor %d is on %s", i, x.Device)
		}
		if x.Nbytes == 0 {
			m.Tensors = append(m.Tensors, tensorRef{Alloc: noAlloc})
			continue
		}
		if err := t.checkDevice("tensor", i, x.Device); err != nil {
			return nil, err
		}
		dev := int(x.Device.ID)
		info, err := cuda.GetPointerInfo(dev, cuda.Ptr(x.Data))
		if err != nil {
			return nil, transport.Wrap(err, "tensor %d at %#x on %s is not CUDA memory this process knows", i, x.Data, x.Device)
		}
		if err := unshareable(i, x, info); err != nil {
			return nil, err
		}
		if info.Device != dev {
			return nil, transport.Errorf(transport.ErrInvalidArgument, "tensor %d is described as %s but its memory is on cuda:%d", i, x.Device, info.Device)
		}
		off := uint64(x.Data) - info.Base
		if uint64(x.Data) < info.Base || off > info.Size || x.Nbytes > info.Size-off {
			return nil, transport.Errorf(transport.ErrInvalidArgument, "tensor %d (%d bytes at %#x) runs past its allocation (%d bytes at %#x)", i, x.Nbytes, x.Data, info.Size, info.Base)
		}
		idx, ok := byBuffer[info.BufferID]
		if !ok {
			h, err := cuda.IPCGetMemHandle(dev, info.Base)
			if err != nil {
				return nil, transport.Wrap(err, "tensor %d", i)
			}
			u, err := cuda.DeviceUUID(dev)
			if err != nil {
				return nil, err
			}
			idx = uint32(len(m.Allocs))
			byBuffer[info.BufferID] = idx
			m.Allocs = append(m.Allocs, allocation{Handle: h, BufferID: info.BufferID, Base: info.Base, Size: info.Size, Device: u})
		}
		m.Tensors = append(m.Tensors, tensorRef{Alloc: idx, Offset: off, Nbytes: x.Nbytes})
	}
	return m.encode(), nil
}

// unshareable is the one place that decides which memory cuda_ipc shares:
// device memory from cuMemAlloc (cudaMalloc, PyTorch's default caching
// allocator), which legacy CUDA IPC exports. It explains why it cannot
// share the memory of tensor i (info is the driver's word on it), naming
// the allocator that made it and what to do instead, or returns nil.
func unshareable(i int, x transport.Tensor, info cuda.PointerInfo) error {
	const instead = "fetch it over another transport (nixl or nccl), or allocate it with plain cudaMalloc/cuMemAlloc"
	switch {
	case info.Managed:
		return transport.Errorf(transport.ErrUnsupported, "tensor %d at %#x is managed (unified) memory, which CUDA IPC cannot share; %s", i, x.Data, instead)
	case info.MemoryType != cuda.MemoryDevice:
		return transport.Errorf(transport.ErrUnsupported, "tensor %d at %#x is not device memory (CUDA memory type %d: pinned or registered host memory; describe it as cuda_host for the host transports)", i, x.Data, info.MemoryType)
	case info.LegacyIPC:
		return nil
	case info.Pool:
		return transport.Errorf(transport.ErrUnsupported, "tensor %d at %#x comes from a stream-ordered memory pool (cudaMallocAsync/cuMemAllocAsync, as PyTorch allocates with PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync), which CUDA IPC cannot share; %s (PyTorch's default backend)", i, x.Data, instead)
	default:
		return transport.Errorf(transport.ErrUnsupported, "tensor %d at %#x lives in memory mapped with CUDA's virtual memory management (cuMemCreate/cuMemMap, as PyTorch allocates with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True), which CUDA IPC cannot share; %s (PyTorch without expandable_segments)", i, x.Data, instead)
	}
}

// GarbageCollect has nothing to undo: an exported handle holds no resource
// in the source, and receivers' mappings are closed by their caches.
func (t *Transport) GarbageCollect(obj transport.ObjectID, tensors []transport.Tensor, tmeta []byte) {
}
