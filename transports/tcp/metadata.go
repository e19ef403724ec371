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
	w := transport.NewMetadataWriter(metaMagic, metaVersion, 4+1+2+len(m.Endpoint)+16+4+1+len(m.Key))
	w.Str16(m.Endpoint)
	w.Raw(m.Object[:])
	w.U32(m.Tensors)
	w.Str8(m.Key)
	return w.Bytes()
}

func decodeMetadata(b []byte) (*metadata, error) {
	r, err := transport.OpenMetadata(b, metaMagic, metaVersion)
	if err != nil {
		return nil, err
	}
	n := int(r.U16())
	if n == 0 || n > maxEndpoint {
		return nil, transport.CorruptMetadata(fmt.Sprintf("endpoint length %d", n))
	}
	m := &metadata{Endpoint: string(r.Take(n)), Object: r.ID(), Tensors: r.U32()}
	k := int(r.U8())
	if r.Err() != nil {
		return nil, transport.CorruptMetadata("too short")
	}
	if k > maxKey {
		return nil, transport.CorruptMetadata(fmt.Sprintf("key length %d", k))
	}
	if r.Len() != k {
		return nil, transport.CorruptMetadata("length does not match")
	}
	m.Key = string(r.Take(k))
	if !printable(m.Endpoint) {
		return nil, transport.CorruptMetadata("endpoint is not printable")
	}
	if !printable(m.Key) {
		return nil, transport.CorruptMetadata("key is not printable")
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
