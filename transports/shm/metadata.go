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
	w := transport.NewWireWriter(nil)
	w.Raw([]byte(metaMagic))
	w.U8(metaVersion)
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
	bad := func(why string) error {
		return transport.Errorf(transport.ErrCorrupt, "corrupt transport metadata (%s)", why)
	}
	r := transport.NewWireReader("transport metadata", b)
	magic, version, pl := r.Take(len(metaMagic)), r.U8(), int(r.U16())
	if r.Err() != nil || string(magic) != metaMagic {
		return nil, bad("bad header")
	}
	if version != metaVersion {
		return nil, transport.Errorf(transport.ErrUnsupported, "metadata version %d, this build reads version %d", version, metaVersion)
	}
	if pl == 0 || pl > maxPath || r.Len() < pl+16+8+4 {
		return nil, bad("socket path")
	}
	m := &metadata{Path: string(r.Take(pl))}
	if !filepath.IsAbs(m.Path) {
		return nil, bad("socket path is not absolute")
	}
	m.Object = r.ID()
	m.Size = r.U64()
	n := r.U32()
	if n > maxRegions || uint64(r.Len()) != uint64(n)*16 {
		return nil, bad("tensor count")
	}
	m.Regions = make([]region, n)
	for i := range m.Regions {
		g := region{Offset: r.U64(), Size: r.U64()}
		if g.Offset > m.Size || g.Size > m.Size-g.Offset {
			return nil, bad("a tensor lies outside the segment")
		}
		m.Regions[i] = g
	}
	return m, r.Done()
}
