package cma

import "github.com/rdt-project/rdt/core/transport"

const (
	metaMagic   = "RCMA"
	metaVersion = 3
	maxRegions  = transport.MaxTensors
	headerLen   = 4 + 1 + 4 + 8 + 8 + 8 + 4
	regionLen   = 16
)

type region struct{ Addr, Size uint64 }

// metadata is what a receiver needs: which process, where each tensor
// lives in it, and the object's guard slot. Layout (little endian): "RCMA",
// version u8, pid u32, start time u64, guard address u64, token u64,
// count u32, then count × (addr u64, size u64).
type metadata struct {
	Pid       uint32
	StartTime uint64
	Guard     uint64
	Token     uint64
	Regions   []region
}

func (m *metadata) encode() []byte {
	w := transport.NewMetadataWriter(metaMagic, metaVersion, headerLen+regionLen*len(m.Regions))
	w.U32(m.Pid)
	w.U64(m.StartTime)
	w.U64(m.Guard)
	w.U64(m.Token)
	w.U32(uint32(len(m.Regions)))
	for _, r := range m.Regions {
		w.U64(r.Addr)
		w.U64(r.Size)
	}
	return w.Bytes()
}

func decodeMetadata(b []byte) (*metadata, error) {
	r, err := transport.OpenMetadata(b, metaMagic, metaVersion)
	if err != nil {
		return nil, err
	}
	m := &metadata{Pid: r.U32(), StartTime: r.U64(), Guard: r.U64(), Token: r.U64()}
	n, err := r.RecordCount("too short", maxRegions, regionLen)
	if err != nil {
		return nil, err
	}
	if m.Pid == 0 || m.Pid > 1<<22 {
		return nil, transport.CorruptMetadata("pid out of range")
	}
	if m.Guard == 0 || m.Guard%slotSize != 0 || m.Token == 0 {
		return nil, transport.CorruptMetadata("no guard word")
	}
	m.Regions = make([]region, n)
	for i := range m.Regions {
		g := region{Addr: r.U64(), Size: r.U64()}
		if g.Addr+g.Size < g.Addr {
			return nil, transport.CorruptMetadata("region wraps the address space")
		}
		m.Regions[i] = g
	}
	return m, r.Done()
}
