package cudaipc

import (
	"github.com/rdt-project/rdt/core/transport"
	"github.com/rdt-project/rdt/transports/internal/cuda"
)

const (
	metaMagic = "RCIP"
	// metaVersion is the layout of objects in cuMemAlloc'd memory only;
	// metaVersionVMM adds allocations shared through file descriptors
	// (virtual memory management). An object is written in the oldest
	// version that holds it, so builds that read version 1 only still read
	// what they can use, and refuse the rest as an unknown version.
	metaVersion    = 1
	metaVersionVMM = 2
	headerLen      = 4 + 1 + 4 + 8 + 4 + 4
	allocLen       = cuda.IPCHandleSize + 8 + 8 + 8 + 16
	tensorLen      = 4 + 8 + 8
	// Version 2: a kind byte before each allocation; a VMM allocation is
	// vmmAllocLen bytes and chunkLen per chunk.
	vmmAllocLen = 8 + 8 + 16 + 4
	chunkLen    = 4 + 8 + 8
	// maxChunks bounds the chunks of one allocation (2 MiB each at the
	// least: 128 GiB).
	maxChunks = 1 << 16
	// noAlloc marks an empty tensor, which needs no allocation.
	noAlloc = ^uint32(0)
)

// Allocation kinds (version 2).
const (
	kindIPC = 0
	kindVMM = 1
)

// allocation is one source allocation, shared by every tensor of the
// object that lives in it: a cuMemAlloc'd block (Chunks nil), or a run of
// chunks of virtual memory management mapped one after the other in the
// source (Chunks set; Handle and BufferID unused).
type allocation struct {
	Handle   cuda.IPCHandle // of the allocation base
	BufferID uint64         // CU_POINTER_ATTRIBUTE_BUFFER_ID: unique in the source process
	Base     uint64         // base address in the source process
	Size     uint64
	Device   cuda.UUID
	Chunks   []chunk
}

// chunk is one cuMemCreate allocation of a VMM allocation, exported as a
// file descriptor that the source keeps open while the object is exposed.
type chunk struct {
	FD   int32  // the descriptor's number in the source process
	ID   uint64 // the export's number in the source process: never reused
	Size uint64 // bytes mapped, from the chunk's start
}

// tensorRef places one tensor in an allocation.
type tensorRef struct {
	Alloc  uint32 // index into allocations, or noAlloc for an empty tensor
	Offset uint64
	Nbytes uint64
}

// metadata is what a receiver needs. Layout (little endian): "RCIP",
// version u8, pid u32, process token u64, allocation count u32, tensor
// count u32, then per allocation, then per tensor (allocation u32, offset
// u64, nbytes u64). An allocation of version 1: IPC handle [64], buffer id
// u64, base u64, size u64, device UUID [16]. Of version 2: a kind u8, then
// for kindIPC the same, for kindVMM base u64, size u64, device UUID [16],
// chunk count u32 and per chunk (fd u32, export id u64, size u64); at
// least one allocation is kindVMM.
type metadata struct {
	Pid     uint32
	Token   uint64 // random per process: with the pid, names the source process
	Allocs  []allocation
	Tensors []tensorRef
}

func (m *metadata) version() uint8 {
	for _, a := range m.Allocs {
		if a.Chunks != nil {
			return metaVersionVMM
		}
	}
	return metaVersion
}

func (m *metadata) encode() []byte {
	v := m.version()
	size := headerLen + allocLen*len(m.Allocs) + tensorLen*len(m.Tensors)
	if v == metaVersionVMM {
		size += len(m.Allocs)
		for _, a := range m.Allocs {
			size += chunkLen * len(a.Chunks)
		}
	}
	w := transport.NewMetadataWriter(metaMagic, v, size)
	w.U32(m.Pid)
	w.U64(m.Token)
	w.U32(uint32(len(m.Allocs)))
	w.U32(uint32(len(m.Tensors)))
	for _, a := range m.Allocs {
		if v == metaVersionVMM {
			if a.Chunks != nil {
				w.U8(kindVMM)
				w.U64(a.Base)
				w.U64(a.Size)
				w.Raw(a.Device[:])
				w.U32(uint32(len(a.Chunks)))
				for _, c := range a.Chunks {
					w.U32(uint32(c.FD))
					w.U64(c.ID)
					w.U64(c.Size)
				}
				continue
			}
			w.U8(kindIPC)
		}
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
	r, v, err := transport.OpenMetadataVersions(b, metaMagic, metaVersion, metaVersionVMM)
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
	if v == metaVersion {
		if uint64(r.Len()) != uint64(na)*allocLen+uint64(nt)*tensorLen {
			return nil, transport.CorruptMetadata("length does not match the counts")
		}
	} else if uint64(r.Len()) < uint64(na)*(1+min(allocLen, vmmAllocLen+chunkLen))+uint64(nt)*tensorLen {
		return nil, transport.CorruptMetadata("too short for the counts")
	}
	if m.Pid == 0 {
		return nil, transport.CorruptMetadata("no process id")
	}
	m.Allocs = make([]allocation, na)
	vmm := false
	for i := range m.Allocs {
		a := &m.Allocs[i]
		kind := uint8(kindIPC)
		if v == metaVersionVMM {
			kind = r.U8()
		}
		switch kind {
		case kindIPC:
			copy(a.Handle[:], r.Take(len(a.Handle)))
			a.BufferID, a.Base, a.Size = r.U64(), r.U64(), r.U64()
			copy(a.Device[:], r.Take(len(a.Device)))
		case kindVMM:
			vmm = true
			a.Base, a.Size = r.U64(), r.U64()
			copy(a.Device[:], r.Take(len(a.Device)))
			n := r.Count("chunk", maxChunks, chunkLen)
			if r.Err() != nil {
				return nil, transport.CorruptMetadata("chunk count out of range")
			}
			if n == 0 {
				return nil, transport.CorruptMetadata("an allocation without chunks")
			}
			a.Chunks = make([]chunk, n)
			var sum uint64
			for j := range a.Chunks {
				c := chunk{FD: int32(r.U32()), ID: r.U64(), Size: r.U64()}
				if c.FD < 0 || c.Size == 0 || sum+c.Size < sum {
					return nil, transport.CorruptMetadata("chunk out of range")
				}
				sum += c.Size
				a.Chunks[j] = c
			}
			if sum != a.Size {
				return nil, transport.CorruptMetadata("chunks do not add up to their allocation")
			}
		default:
			return nil, transport.CorruptMetadata("unknown allocation kind")
		}
		if r.Err() != nil {
			return nil, transport.CorruptMetadata("too short")
		}
		if a.Size == 0 || a.Base == 0 || a.Base+a.Size < a.Base {
			return nil, transport.CorruptMetadata("allocation out of range")
		}
	}
	if v == metaVersionVMM && !vmm {
		return nil, transport.CorruptMetadata("version 2 without a chunked allocation")
	}
	if uint64(r.Len()) != uint64(nt)*tensorLen {
		return nil, transport.CorruptMetadata("length does not match the counts")
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
