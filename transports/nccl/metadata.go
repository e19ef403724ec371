package nccl

import "github.com/rdt-project/rdt/core/transport"

// cmeta is the communicator metadata of one transfer, made by the
// destination: the group, both ranks, and the transfer's place in the order
// of transfers from Src to Dst (NCCL matches sends and receives between two
// ranks in the order they are enqueued, so both sides enqueue by Seq).
type cmeta struct {
	Group    string
	Instance uint64
	Src, Dst int
	Seq      uint64
}

const cmetaVersion = 1

func (m *cmeta) encode() []byte {
	w := transport.NewWireWriter(make([]byte, 0, 2+len(m.Group)+8+4+4+8))
	w.U8(cmetaVersion)
	w.Str8(m.Group)
	w.U64(m.Instance)
	w.U32(uint32(m.Src))
	w.U32(uint32(m.Dst))
	w.U64(m.Seq)
	return w.Bytes()
}

func decodeCMeta(b []byte) (*cmeta, error) {
	bad := func(why string) (*cmeta, error) {
		return nil, transport.Errorf(transport.ErrCorrupt, "communicator metadata: %s", why)
	}
	r := transport.NewWireReader("communicator metadata", b)
	version, n := r.U8(), int(r.U8())
	if r.Err() != nil {
		return bad("truncated")
	}
	if version != cmetaVersion {
		return bad("unknown version")
	}
	if r.Len() != n+8+4+4+8 {
		return bad("wrong length")
	}
	m := &cmeta{Group: string(r.Take(n))}
	if err := transport.CheckGroupName(m.Group); err != nil {
		return bad(err.Error())
	}
	m.Instance = r.U64()
	src, dst := r.U32(), r.U32()
	m.Seq = r.U64()
	if src >= transport.MaxGroupSize || dst >= transport.MaxGroupSize || src == dst {
		return bad("ranks out of range")
	}
	m.Src, m.Dst = int(src), int(dst)
	if err := r.Done(); err != nil {
		return nil, err
	}
	return m, nil
}
