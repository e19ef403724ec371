package shm

import (
	"encoding/binary"

	"github.com/rdt-project/rdt/core/transport"
)

// The segment server's protocol: a request names an object, a reply
// carries a status and the segment's size (and its descriptor, as SCM_RIGHTS).
const (
	requestMagic = "RSQ1"
	requestLen   = 4 + 16
	replyLen     = 4 + 4 + 8
	maxMessage   = 1024
)

func encodeRequest(obj transport.ObjectID) []byte {
	return append([]byte(requestMagic), obj[:]...)
}

func decodeRequest(b []byte) (transport.ObjectID, error) {
	var id transport.ObjectID
	if len(b) != requestLen || string(b[:4]) != requestMagic {
		return id, transport.Errorf(transport.ErrCorrupt, "malformed segment request")
	}
	copy(id[:], b[4:])
	return id, nil
}

// A reply: status i32, size u64, message length u32, message.
func encodeReply(st transport.Status, msg string, size uint64) []byte {
	if len(msg) > maxMessage {
		msg = msg[:maxMessage]
	}
	b := binary.LittleEndian.AppendUint32(nil, uint32(int32(st)))
	b = binary.LittleEndian.AppendUint64(b, size)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(msg)))
	return append(b, msg...)
}

func decodeReply(b []byte) (transport.Status, string, uint64, error) {
	if len(b) < replyLen {
		return 0, "", 0, transport.Errorf(transport.ErrCorrupt, "short reply from the source")
	}
	st := transport.Status(int32(binary.LittleEndian.Uint32(b)))
	size := binary.LittleEndian.Uint64(b[4:])
	n := binary.LittleEndian.Uint32(b[12:])
	if uint64(n) != uint64(len(b)-replyLen) {
		return 0, "", 0, transport.Errorf(transport.ErrCorrupt, "malformed reply from the source")
	}
	return st, string(b[replyLen:]), size, nil
}
