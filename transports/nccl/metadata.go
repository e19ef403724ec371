package nccl

import (
	"encoding/binary"

	"github.com/rdt-project/rdt/core/transport"
)

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
	b := make([]byte, 0, 2+len(m.Group)+8+4+4+8)
	b = append(b, cmetaVersion, byte(len(m.Group)))
	b = append(b, m.Group...)
	b = binary.LittleEndian.AppendUint64(b, m.Instance)
	b = binary.LittleEndian.AppendUint32(b, uint32(m.Src))
	b = binary.LittleEndian.AppendUint32(b, uint32(m.Dst))
	return binary.LittleEndian.AppendUint64(b, m.Seq)
}

func decodeCMeta(b []byte) (*cmeta, error) {
	bad := func(why string) (*cmeta, error) {
		return nil, transport.Errorf(transport.ErrCorrupt, "nccl communicator metadata: %s", why)
	}
	if len(b) < 2 {
		return bad("truncated")
	}
	if b[0] != cmetaVersion {
		return bad("unknown version")
	}
	n := int(b[1])
	if len(b) != 2+n+8+4+4+8 {
		return bad("wrong length")
	}
	m := &cmeta{Group: string(b[2 : 2+n])}
	if err := transport.CheckGroupName(m.Group); err != nil {
		return bad(err.Error())
	}
	b = b[2+n:]
	m.Instance = binary.LittleEndian.Uint64(b)
	src, dst := binary.LittleEndian.Uint32(b[8:]), binary.LittleEndian.Uint32(b[12:])
	m.Seq = binary.LittleEndian.Uint64(b[16:])
	if src >= transport.MaxGroupSize || dst >= transport.MaxGroupSize || src == dst {
		return bad("ranks out of range")
	}
	m.Src, m.Dst = int(src), int(dst)
	return m, nil
}
