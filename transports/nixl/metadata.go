package nixl

import "github.com/rdt-project/rdt/core/transport"

const (
	metaMagic = "RNXL"
	// Version 2 adds a promise, no field: the source registered touching
	// regions of one memory type and device as one, so one read may span
	// them. Version 1 (no such promise) is still read.
	metaVersion       = 2
	metaOldestVersion = 1
	maxRegions        = transport.MaxTensors
	maxBlob           = 16 << 20 // one NIXL metadata blob
	maxBlobs          = 2        // one per memory type (DRAM, VRAM)
	maxName           = 64
	regionLen         = 8 + 8 + 4 + 1
)

// memory types, as nixl_capi_mem_type_t.
const (
	memDRAM uint8 = 0
	memVRAM uint8 = 1
)

type region struct {
	Addr, Size uint64
	Dev        uint32
	Mem        uint8
}

// metadata is what a receiver needs to read an object with NIXL: the
// source agent's name, its connection information (the same for every
// object of that agent), the agent's metadata for this object's registered
// memory (one blob per memory type), the registration epoch (see
// Transport.epoch), and where each tensor lives.
//
// Layout (little endian): "RNXL", version u8 (see metaVersion), epoch u64, name length u8,
// name, connection length u32, connection blob, blob count u8, blob count ×
// (length u32, blob), region count u32, count × (addr u64, size u64,
// device u32, memory type u8).
type metadata struct {
	Version uint8 // as decoded; encode writes metaVersion
	Epoch   uint64
	Agent   string
	Conn    []byte
	Blobs   [][]byte
	Regions []region
}

func (m *metadata) encode() []byte {
	n := 4 + 1 + 8 + 1 + len(m.Agent) + 4 + len(m.Conn) + 1 + 4 + regionLen*len(m.Regions)
	for _, b := range m.Blobs {
		n += 4 + len(b)
	}
	w := transport.NewMetadataWriter(metaMagic, metaVersion, n)
	w.U64(m.Epoch)
	w.Str8(m.Agent)
	w.Bytes32(m.Conn)
	w.U8(uint8(len(m.Blobs)))
	for _, x := range m.Blobs {
		w.Bytes32(x)
	}
	w.U32(uint32(len(m.Regions)))
	for _, r := range m.Regions {
		w.U64(r.Addr)
		w.U64(r.Size)
		w.U32(r.Dev)
		w.U8(r.Mem)
	}
	return w.Bytes()
}

func validName(s string) bool {
	if len(s) == 0 || len(s) > maxName {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c == '-' || c == '_' || c == '.') {
			return false
		}
	}
	return true
}

func decodeMetadata(b []byte) (*metadata, error) {
	r, version, err := transport.OpenMetadataVersions(b, metaMagic, metaOldestVersion, metaVersion)
	if err != nil {
		return nil, err
	}
	m := &metadata{Version: version, Epoch: r.U64()}
	m.Agent = string(r.Take(int(r.U8())))
	if r.Err() != nil {
		return nil, transport.CorruptMetadata("truncated header")
	}
	if !validName(m.Agent) {
		return nil, transport.CorruptMetadata("invalid agent name")
	}
	n := r.U32()
	if n == 0 || n > maxBlob {
		return nil, transport.CorruptMetadata("connection blob size out of range")
	}
	m.Conn = r.Take(int(n))
	nb := r.U8()
	if nb > maxBlobs {
		return nil, transport.CorruptMetadata("too many metadata blobs")
	}
	for i := 0; i < int(nb) && r.Err() == nil; i++ {
		n := r.U32()
		if n == 0 || n > maxBlob {
			return nil, transport.CorruptMetadata("metadata blob size out of range")
		}
		m.Blobs = append(m.Blobs, r.Take(int(n)))
	}
	cnt, err := r.RecordCount("truncated", maxRegions, regionLen)
	if err != nil {
		return nil, err
	}
	m.Regions = make([]region, cnt)
	for i := range m.Regions {
		g := region{Addr: r.U64(), Size: r.U64(), Dev: r.U32(), Mem: r.U8()}
		if g.Mem != memDRAM && g.Mem != memVRAM {
			return nil, transport.CorruptMetadata("unknown memory type")
		}
		if g.Addr+g.Size < g.Addr {
			return nil, transport.CorruptMetadata("region wraps the address space")
		}
		m.Regions[i] = g
	}
	if cnt > 0 && len(m.Blobs) == 0 {
		return nil, transport.CorruptMetadata("tensors without registration metadata")
	}
	return m, r.Done()
}
