package cudaipc

import (
	"github.com/rdt-project/rdt/core/transport"
	"github.com/rdt-project/rdt/transports/internal/cuda"
)

// ExtractMetadata exports an IPC handle of every cuMemAlloc'd allocation
// holding the tensors, and a file descriptor of every chunk of virtual
// memory management holding them (see vmm.go), and records where in its
// allocation each tensor lies.
func (t *Transport) ExtractMetadata(obj transport.ObjectID, tensors []transport.Tensor) (meta []byte, err error) {
	m := metadata{Pid: uint32(t.pid), Token: procToken, Tensors: make([]tensorRef, len(tensors))}
	byBuffer := map[uint64]uint32{}
	var vmm vmmObject
	defer func() {
		if err != nil {
			vmm.release()
		}
	}()
	for i, x := range tensors {
		if x.Device.Type != transport.DeviceCUDA {
			return nil, transport.Errorf(transport.ErrUnsupported, "it moves CUDA device memory; tensor %d is on %s", i, x.Device)
		}
		if x.Nbytes == 0 {
			m.Tensors[i] = tensorRef{Alloc: noAlloc}
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
		if !info.LegacyIPC {
			if err := vmm.add(i, x); err != nil {
				return nil, err
			}
			continue
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
		m.Tensors[i] = tensorRef{Alloc: idx, Offset: off, Nbytes: x.Nbytes}
	}
	if err := vmm.export(&m, tensors); err != nil {
		return nil, err
	}
	return m.encode(), nil
}

// unshareable is the one place that decides which memory cuda_ipc shares:
// device memory from cuMemAlloc (cudaMalloc, PyTorch's default caching
// allocator), which legacy CUDA IPC exports, and memory mapped with
// virtual memory management, whose chunks vmm.go exports as file
// descriptors (it refuses a chunk that cannot be). Stream-ordered pool
// memory is refused: a device's default pool cannot be exported. It explains why it cannot
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
		// Virtual memory management (cuMemCreate/cuMemMap, PyTorch's
		// expandable segments): shared chunk by chunk through file
		// descriptors when its chunks allow it (vmm.go).
		return nil
	}
}

// GarbageCollect closes the file descriptors the object's chunks of
// virtual memory management were exported as, unless another exposed
// object still uses them. Legacy IPC handles hold nothing in the source,
// and receivers' mappings are closed by their caches.
func (t *Transport) GarbageCollect(obj transport.ObjectID, tensors []transport.Tensor, tmeta []byte) {
	m, err := decodeMetadata(tmeta)
	if err != nil {
		t.h.Log().Warnf("garbage collection of an object whose metadata does not decode: %v", err)
		return
	}
	if int(m.Pid) != t.pid || m.Token != procToken {
		return // not this process's: nothing of it was exported here
	}
	for _, a := range m.Allocs {
		for _, c := range a.Chunks {
			exports.release(c.ID)
		}
	}
}
