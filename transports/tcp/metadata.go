package tcp

import (
	"fmt"

	"github.com/rdt-project/rdt/core/transport"
)

const (
	metaMagic   = "RTCP"
	metaVersion = 2
	maxEndpoint = 300
	maxKey      = 64
)

// metadata tells a receiver where to pull an object from and, when the
// source has no configured token, the key its data endpoint requires.
// Layout: "RTCP", version u8, endpoint length u16, endpoint ("host:port"),
// object [16], tensor count u32, key length u8, key (printable ASCII).
type metadata struct {
	Endpoint string
	Object   transport.ObjectID
	Tensors  uint32
	Key      string // "": use the receiver's configured token
}

func (m *metadata) encode() []byte {
	w := transport.NewWireWriter(make([]byte, 0, 4+1+2+len(m.Endpoint)+16+4+1+len(m.Key)))
	w.Raw([]byte(metaMagic))
	w.U8(metaVersion)
	w.Str16(m.Endpoint)
	w.Raw(m.Object[:])
	w.U32(m.Tensors)
	w.Str8(m.Key)
	return w.Bytes()
}

func decodeMetadata(b []byte) (*metadata, error) {
	bad := func(why string) error {
		return transport.Errorf(transport.ErrCorrupt, "corrupt transport metadata (%s)", why)
	}
	r := transport.NewWireReader("transport metadata", b)
	magic, version, n := r.Take(len(metaMagic)), r.U8(), int(r.U16())
	if r.Err() != nil {
		return nil, bad("too short")
	}
	if string(magic) != metaMagic {
		return nil, bad("bad magic")
	}
	if version != metaVersion {
		return nil, transport.Errorf(transport.ErrUnsupported, "metadata version %d, this build reads version %d", version, metaVersion)
	}
	if n == 0 || n > maxEndpoint {
		return nil, bad(fmt.Sprintf("endpoint length %d", n))
	}
	m := &metadata{Endpoint: string(r.Take(n)), Object: r.ID(), Tensors: r.U32()}
	k := int(r.U8())
	if r.Err() != nil {
		return nil, bad("too short")
	}
	if k > maxKey {
		return nil, bad(fmt.Sprintf("key length %d", k))
	}
	if r.Len() != k {
		return nil, bad("length does not match")
	}
	m.Key = string(r.Take(k))
	if !printable(m.Endpoint) {
		return nil, bad("endpoint is not printable")
	}
	if !printable(m.Key) {
		return nil, bad("key is not printable")
	}
	return m, r.Done()
}

func printable(s string) bool {
	for _, c := range []byte(s) {
		if c <= ' ' || c >= 0x7f {
			return false
		}
	}
	return true
}
