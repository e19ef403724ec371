package shm

import (
	"path/filepath"

	"github.com/rdt-project/rdt/core/transport"
)

const (
	metaMagic   = "RSHM"
	metaVersion = 1
	maxRegions  = 1 << 16
	maxPath     = 107
)

type region struct{ Offset, Size uint64 }

// metadata: "RSHM", version u8, path length u16, path, object [16],
// segment size u64, count u32, count × (offset u64, size u64).
type metadata struct {
	Path    string
	Object  transport.ObjectID
	Size    uint64
	Regions []region
}

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
	return w.Bytes()
}

func decodeMetadata(b []byte) (*metadata, error) {
	r, err := transport.OpenMetadata(b, metaMagic, metaVersion)
	if err != nil {
		return nil, err
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
	if n > maxRegions || uint64(r.Len()) != uint64(n)*16 {
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
	return m, r.Done()
}
