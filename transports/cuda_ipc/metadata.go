package cudaipc

import (
	"github.com/rdt-project/rdt/core/transport"
	"github.com/rdt-project/rdt/transports/internal/cuda"
)

const (
	metaMagic   = "RCIP"
	metaVersion = 1
	headerLen   = 4 + 1 + 4 + 8 + 4 + 4
	allocLen    = cuda.IPCHandleSize + 8 + 8 + 8 + 16
	tensorLen   = 4 + 8 + 8
	// noAlloc marks an empty tensor, which needs no allocation.
	noAlloc = ^uint32(0)
)

// allocation is one source allocation (cuMemAlloc'd block), shared by every
// tensor of the object that lives in it.
type allocation struct {
	Handle   cuda.IPCHandle // of the allocation base
	BufferID uint64         // CU_POINTER_ATTRIBUTE_BUFFER_ID: unique in the source process
	Base     uint64         // base address in the source process
	Size     uint64
	Device   cuda.UUID
}

// tensorRef places one tensor in an allocation.
type tensorRef struct {
	Alloc  uint32 // index into allocations, or noAlloc for an empty tensor
	Offset uint64
	Nbytes uint64
}

// metadata is what a receiver needs. Layout (little endian): "RCIP",
// version u8, pid u32, process token u64, allocation count u32, tensor
// count u32, then per allocation (IPC handle [64], buffer id u64, base u64,
// size u64, device UUID [16]), then per tensor (allocation u32, offset u64,
// nbytes u64).
type metadata struct {
	Pid     uint32
	Token   uint64 // random per process: with the pid, names the source process
	Allocs  []allocation
	Tensors []tensorRef
}

func (m *metadata) encode() []byte {
	w := transport.NewMetadataWriter(metaMagic, metaVersion, headerLen+allocLen*len(m.Allocs)+tensorLen*len(m.Tensors))
	w.U32(m.Pid)
	w.U64(m.Token)
	w.U32(uint32(len(m.Allocs)))
	w.U32(uint32(len(m.Tensors)))
	for _, a := range m.Allocs {
		w.Raw(a.Handle[:])
		w.U64(a.BufferID)
		w.U64(a.Base)
		w.U64(a.Size)
		w.Raw(a.Device[:])
	}
	for _, t := range m.Tensors {
		w.U32(t.Alloc)
		w.U64(t.Offset)
		w.U64(t.Nbytes)
	}
	return w.Bytes()
}

func decodeMetadata(b []byte) (*metadata, error) {
	r, err := transport.OpenMetadata(b, metaMagic, metaVersion)
	if err != nil {
		return nil, err
	}
	m := &metadata{Pid: r.U32(), Token: r.U64()}
	na, nt := r.U32(), r.U32()
	if r.Err() != nil {
		return nil, transport.CorruptMetadata("too short")
	}
	if na > transport.MaxTensors || nt > transport.MaxTensors {
		return nil, transport.CorruptMetadata("too many tensors")
	}
	if na > nt {
		return nil, transport.CorruptMetadata("more allocations than tensors")
	}
	if uint64(r.Len()) != uint64(na)*allocLen+uint64(nt)*tensorLen {
		return nil, transport.CorruptMetadata("length does not match the counts")
	}
	if m.Pid == 0 {
		return nil, transport.CorruptMetadata("no process id")
	}
	m.Allocs = make([]allocation, na)
	for i := range m.Allocs {
		a := &m.Allocs[i]
		copy(a.Handle[:], r.Take(len(a.Handle)))
		a.BufferID, a.Base, a.Size = r.U64(), r.U64(), r.U64()
		copy(a.Device[:], r.Take(len(a.Device)))
		if a.Size == 0 || a.Base == 0 || a.Base+a.Size < a.Base {
			return nil, transport.CorruptMetadata("allocation out of range")
		}
	}
	m.Tensors = make([]tensorRef, nt)
	for i := range m.Tensors {
		t := tensorRef{Alloc: r.U32(), Offset: r.U64(), Nbytes: r.U64()}
		if t.Alloc == noAlloc {
			if t.Nbytes != 0 || t.Offset != 0 {
				return nil, transport.CorruptMetadata("a tensor outside every allocation")
			}
		} else {
			if t.Alloc >= na {
				return nil, transport.CorruptMetadata("allocation index out of range")
			}
			size := m.Allocs[t.Alloc].Size
			if t.Offset > size || t.Nbytes > size-t.Offset {
				return nil, transport.CorruptMetadata("tensor outside its allocation")
			}
		}
		m.Tensors[i] = t
	}
	return m, r.Done()
}
