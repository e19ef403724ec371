package shm

import (
	"encoding/binary"

	"github.com/rdt-project/rdt/core/transport"
)

// The segment server's protocol, version 2. A request names an object and
// how many bytes the receiver takes inline; a reply carries a status, the
// segment's size, flags and a message, then either the segment's bytes
// (flagInline: a segment no larger than both sides' inline bound) or
// nothing, with the segment's descriptor attached as SCM_RIGHTS.
//
//	request: "RSQ2", object [16], inline limit u32
//	reply:   "RSR2", status i32, size u64, flags u32, message length u32,
//	         message, then size bytes when flagInline is set
//
// A version-1 request ("RSQ1", from an older build) gets a version-1 reply
// saying the versions differ.
const (
	requestMagic   = "RSQ2"
	requestMagicV1 = "RSQ1"
	replyMagic     = "RSR2"
	requestLen     = 4 + 16 + 4
	requestLenV1   = 4 + 16
	replyLen       = 4 + 4 + 8 + 4 + 4
	maxMessage     = 1024

	flagInline = 1 // the segment's bytes follow the reply
)

func encodeRequest(obj transport.ObjectID, inlineLimit uint32) []byte {
	b := append([]byte(requestMagic), obj[:]...)
	return binary.LittleEndian.AppendUint32(b, inlineLimit)
}

func decodeRequest(b []byte) (transport.ObjectID, uint32, error) {
	var id transport.ObjectID
	if len(b) != requestLen || string(b[:4]) != requestMagic {
		return id, 0, transport.Errorf(transport.ErrCorrupt, "malformed segment request")
	}
	copy(id[:], b[4:])
	return id, binary.LittleEndian.Uint32(b[20:]), nil
}

// replyHeader is a reply without its message and bytes.
type replyHeader struct {
	status transport.Status
	size   uint64
	flags  uint32
	msgLen uint32
}

// encodeReply makes a reply's header and message; the caller appends the
// segment's bytes when flags has flagInline.
func encodeReply(st transport.Status, msg string, size uint64, flags uint32) []byte {
	if len(msg) > maxMessage {
		msg = msg[:maxMessage]
	}
	b := append(make([]byte, 0, replyLen+len(msg)), replyMagic...)
	b = binary.LittleEndian.AppendUint32(b, uint32(int32(st)))
	b = binary.LittleEndian.AppendUint64(b, size)
	b = binary.LittleEndian.AppendUint32(b, flags)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(msg)))
	return append(b, msg...)
}

// decodeReplyHeader reads the fixed part of a reply (replyLen bytes).
func decodeReplyHeader(b []byte) (replyHeader, error) {
	if len(b) < replyLen {
		return replyHeader{}, transport.Errorf(transport.ErrCorrupt, "short reply from the source")
	}
	if string(b[:4]) != replyMagic {
		return replyHeader{}, transport.Errorf(transport.ErrCorrupt, "the source's segment server speaks another protocol version (is it an older build of rdt?)")
	}
	h := replyHeader{
		status: transport.Status(int32(binary.LittleEndian.Uint32(b[4:]))),
		size:   binary.LittleEndian.Uint64(b[8:]),
		flags:  binary.LittleEndian.Uint32(b[16:]),
		msgLen: binary.LittleEndian.Uint32(b[20:]),
	}
	if h.msgLen > maxMessage || h.flags&^flagInline != 0 || (h.flags&flagInline != 0 && h.status != transport.OK) {
		return replyHeader{}, transport.Errorf(transport.ErrCorrupt, "malformed reply from the source")
	}
	return h, nil
}

// encodeReplyV1 answers a version-1 request in its own format (status i32,
// size u64, message length u32, message), so an older receiver reads why.
func encodeReplyV1(st transport.Status, msg string) []byte {
	b := binary.LittleEndian.AppendUint32(nil, uint32(int32(st)))
	b = binary.LittleEndian.AppendUint64(b, 0)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(msg)))
	return append(b, msg...)
}
