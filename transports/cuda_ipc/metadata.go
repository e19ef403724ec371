package cudaipc

import (
	"encoding/binary"

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
	b := make([]byte, 0, headerLen+allocLen*len(m.Allocs)+tensorLen*len(m.Tensors))
	b = append(b, metaMagic...)
	b = append(b, metaVersion)
	b = binary.LittleEndian.AppendUint32(b, m.Pid)
	b = binary.LittleEndian.AppendUint64(b, m.Token)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(m.Allocs)))
	b = binary.LittleEndian.AppendUint32(b, uint32(len(m.Tensors)))
	for _, a := range m.Allocs {
		b = append(b, a.Handle[:]...)
		b = binary.LittleEndian.AppendUint64(b, a.BufferID)
		b = binary.LittleEndian.AppendUint64(b, a.Base)
		b = binary.LittleEndian.AppendUint64(b, a.Size)
		b = append(b, a.Device[:]...)
	}
	for _, t := range m.Tensors {
		b = binary.LittleEndian.AppendUint32(b, t.Alloc)
		b = binary.LittleEndian.AppendUint64(b, t.Offset)
		b = binary.LittleEndian.AppendUint64(b, t.Nbytes)
	}
	return b
}

func decodeMetadata(b []byte) (*metadata, error) {
	bad := func(why string) error {
		return transport.Errorf(transport.ErrCorrupt, "cuda_ipc: corrupt transport metadata (%s)", why)
	}
	if len(b) < headerLen {
		return nil, bad("too short")
	}
	if string(b[:4]) != metaMagic {
		return nil, bad("bad magic")
	}
	if b[4] != metaVersion {
		return nil, transport.Errorf(transport.ErrUnsupported, "cuda_ipc: metadata version %d, this build reads version %d", b[4], metaVersion)
	}
	m := &metadata{Pid: binary.LittleEndian.Uint32(b[5:]), Token: binary.LittleEndian.Uint64(b[9:])}
	na := binary.LittleEndian.Uint32(b[17:])
	nt := binary.LittleEndian.Uint32(b[21:])
	if na > transport.MaxTensors || nt > transport.MaxTensors {
		return nil, bad("too many tensors")
	}
	if na > nt {
		return nil, bad("more allocations than tensors")
	}
	if uint64(len(b)-headerLen) != uint64(na)*allocLen+uint64(nt)*tensorLen {
		return nil, bad("length does not match the counts")
	}
	if m.Pid == 0 {
		return nil, bad("no process id")
	}
	p := b[headerLen:]
	m.Allocs = make([]allocation, na)
	for i := range m.Allocs {
		a := &m.Allocs[i]
		copy(a.Handle[:], p)
		q := p[cuda.IPCHandleSize:]
		a.BufferID = binary.LittleEndian.Uint64(q)
		a.Base = binary.LittleEndian.Uint64(q[8:])
		a.Size = binary.LittleEndian.Uint64(q[16:])
		copy(a.Device[:], q[24:40])
		if a.Size == 0 || a.Base == 0 || a.Base+a.Size < a.Base {
			return nil, bad("allocation out of range")
		}
		p = p[allocLen:]
	}
	m.Tensors = make([]tensorRef, nt)
	for i := range m.Tensors {
		t := tensorRef{
			Alloc:  binary.LittleEndian.Uint32(p),
			Offset: binary.LittleEndian.Uint64(p[4:]),
			Nbytes: binary.LittleEndian.Uint64(p[12:]),
		}
		p = p[tensorLen:]
		if t.Alloc == noAlloc {
			if t.Nbytes != 0 || t.Offset != 0 {
				return nil, bad("a tensor outside every allocation")
			}
		} else {
			if t.Alloc >= na {
				return nil, bad("allocation index out of range")
			}
			size := m.Allocs[t.Alloc].Size
			if t.Offset > size || t.Nbytes > size-t.Offset {
				return nil, bad("tensor outside its allocation")
			}
		}
		m.Tensors[i] = t
	}
	return m, nil
}
