package shm

import (
	"path/filepath"

	"github.com/rdt-project/rdt/core/transport"
)

const (
	metaMagic = "RSHM"
	// Version 2 adds where an object staged in the source's arena lies.
	// Version 1 (earlier builds: every object in a segment of its own) is
	// still read.
	metaVersion       = 2
	metaOldestVersion = 1
	maxRegions        = transport.MaxTensors
	maxPath           = 107
)

type region struct{ Offset, Size uint64 }

// metadata: "RSHM", version u8, path length u16, path, object [16],
// segment size u64, count u32, count × (offset u64, size u64); version 2
// then: arena [16] (zero: the object has a segment of its own), slot u32,
// tag u64, base u64 (the object's offset in the arena; its regions'
// offsets are from there).
type metadata struct {
	Path   string
	Object transport.ObjectID
	Size   uint64
	// Regions are where the tensors lie in the segment, region i being
	// what target i of a whole fetch receives; a partial fetch replaces
	// them with its pieces' (takePieces).
	Regions []region
	Arena   transport.ObjectID
	Slot    uint32
	Tag     uint64
	Base    uint64

	askArena bool // not encoded: a request for the arena named Arena
	askView  bool // not encoded: a request for the segment a view maps
	partial  bool // not encoded: Regions are a partial fetch's pieces
}

// takePieces makes region i the bytes of the segment that target i of a
// partial fetch receives, so that every copy, which reads region i into
// target i, moves exactly the pieces. The pieces were checked against
// the regions (Transfer.CheckPieces), so each lies inside its tensor's.
func (m *metadata) takePieces(pieces []transport.Piece) {
	regions := make([]region, len(pieces))
	for i, p := range pieces {
		regions[i] = region{Offset: m.Regions[p.Tensor].Offset + p.Offset, Size: p.Length}
	}
	m.Regions, m.partial = regions, true
}

// inArena is whether the object was staged in the source's arena.
func (m *metadata) inArena() bool { return m.Arena != transport.ObjectID{} }

func (m *metadata) encode() []byte {
	w := transport.NewMetadataWriter(metaMagic, metaVersion, 0)
	w.Str16(m.Path)
	w.Raw(m.Object[:])
	w.U64(m.Size)
	w.U32(uint32(len(m.Regions)))
	for _, r := range m.Regions {
		w.U64(r.Offset)
		w.U64(r.Size)
	}
	w.Raw(m.Arena[:])
	w.U32(m.Slot)
	w.U64(m.Tag)
	w.U64(m.Base)
	return w.Bytes()
}

func decodeMetadata(b []byte) (*metadata, error) {
	r, version, err := transport.OpenMetadataVersions(b, metaMagic, metaOldestVersion, metaVersion)
	if err != nil {
		return nil, err
	}
	arenaLen := 0
	if version >= 2 {
		arenaLen = 16 + 4 + 8 + 8
	}
	pl := int(r.U16())
	if pl == 0 || pl > maxPath || r.Len() < pl+16+8+4 {
		return nil, transport.CorruptMetadata("socket path")
	}
	m := &metadata{Path: string(r.Take(pl))}
	if !filepath.IsAbs(m.Path) {
		return nil, transport.CorruptMetadata("socket path is not absolute")
	}
	m.Object = r.ID()
	m.Size = r.U64()
	n := r.U32()
	if n > maxRegions || uint64(r.Len()) != uint64(n)*16+uint64(arenaLen) {
		return nil, transport.CorruptMetadata("tensor count")
	}
	m.Regions = make([]region, n)
	for i := range m.Regions {
		g := region{Offset: r.U64(), Size: r.U64()}
		if g.Offset > m.Size || g.Size > m.Size-g.Offset {
			return nil, transport.CorruptMetadata("a tensor lies outside the segment")
		}
		m.Regions[i] = g
	}
	if arenaLen > 0 {
		m.Arena, m.Slot, m.Tag, m.Base = r.ID(), r.U32(), r.U64(), r.U64()
		if m.inArena() && (m.Tag == 0 || m.Slot >= arenaSlots || m.Base < arenaTable || m.Base+m.Size < m.Base) {
			return nil, transport.CorruptMetadata("arena slot, tag or place")
		}
	}
	return m, r.Done()
}
