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
func decodeReplyHeader(b []byte) (replyHeader, error) { return decodeReply(b, "source", flagInline) }

// decodeReply reads the fixed part of a reply from who ("source",
// "owner"), whose flags may be those of allowed, with an OK only.
func decodeReply(b []byte, who string, allowed uint32) (replyHeader, error) {
	if len(b) < replyLen {
		return replyHeader{}, transport.Errorf(transport.ErrCorrupt, "short reply from the %s", who)
	}
	if string(b[:4]) != replyMagic {
		return replyHeader{}, transport.Errorf(transport.ErrCorrupt, "the %s's segment server speaks another protocol version (is it an older build of rdt?)", who)
	}
	h := replyHeader{
		status: transport.Status(int32(binary.LittleEndian.Uint32(b[4:]))),
		size:   binary.LittleEndian.Uint64(b[8:]),
		flags:  binary.LittleEndian.Uint32(b[16:]),
		msgLen: binary.LittleEndian.Uint32(b[20:]),
	}
	if h.msgLen > maxMessage || h.flags&^allowed != 0 || (h.flags != 0 && h.status != transport.OK) {
		return replyHeader{}, transport.Errorf(transport.ErrCorrupt, "malformed reply from the %s", who)
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

// Writes, on the same connections (see write.go). A write request names
// the exposed object, the write's id (the writer's Transfer.TransferID,
// which the owner admitted) and the pieces its bytes land in, in the order
// the bytes come; a write of at most inlineMax bytes carries them after
// the pieces. Any other is answered with a reply whose size is the
// staging area's (flagStaging: its descriptor is attached; without it,
// the area sent before on this connection is reused), then moved through
// the area's two slots in chunks: the writer fills a slot and says so, the
// owner copies it into the object and answers, while the writer fills the
// other. Each chunk's answer is a reply whose size is the bytes landed so
// far; the answer to the last is the write's.
//
//	request: "RSW1", object [16], write id u64, count u32,
//	         count × (tensor u32, offset u64, length u64),
//	         then the bytes when they total at most inlineMax
//	chunk:   "RSC1", slot u32, length u64
//
// The staging area starts with a page whose first word a writer that
// aborts sets to the write's id: the owner copies nothing more of it.
const (
	writeMagic     = "RSW1"
	writeHeaderLen = 4 + 16 + 8 + 4
	pieceLen       = 4 + 8 + 8
	chunkMagic     = "RSC1"
	chunkLen       = 4 + 4 + 8

	flagStaging = 2 // the staging area's descriptor comes with the reply
)

// writeHeader is the fixed part of a write request.
type writeHeader struct {
	obj     transport.ObjectID
	writeID uint64
	count   uint32
}

func encodeWriteRequest(obj transport.ObjectID, writeID uint64, pieces []transport.Piece) []byte {
	b := make([]byte, 0, writeHeaderLen+pieceLen*len(pieces))
	b = append(b, writeMagic...)
	b = append(b, obj[:]...)
	b = binary.LittleEndian.AppendUint64(b, writeID)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(pieces)))
	for _, p := range pieces {
		b = binary.LittleEndian.AppendUint32(b, p.Tensor)
		b = binary.LittleEndian.AppendUint64(b, p.Offset)
		b = binary.LittleEndian.AppendUint64(b, p.Length)
	}
	return b
}

func decodeWriteHeader(b []byte) (writeHeader, error) {
	var h writeHeader
	if len(b) != writeHeaderLen || string(b[:4]) != writeMagic {
		return h, transport.Errorf(transport.ErrCorrupt, "malformed write request")
	}
	copy(h.obj[:], b[4:20])
	h.writeID = binary.LittleEndian.Uint64(b[20:])
	h.count = binary.LittleEndian.Uint32(b[28:])
	if h.count > maxRegions {
		return h, transport.Errorf(transport.ErrCorrupt, "a write into %d pieces (at most %d)", h.count, maxRegions)
	}
	return h, nil
}

// decodePieces reads count pieces and their total length, refusing a
// total that overflows.
func decodePieces(b []byte) ([]transport.Piece, uint64, error) {
	pieces := make([]transport.Piece, len(b)/pieceLen)
	var total uint64
	for i := range pieces {
		q := b[i*pieceLen:]
		p := transport.Piece{Tensor: binary.LittleEndian.Uint32(q), Offset: binary.LittleEndian.Uint64(q[4:]), Length: binary.LittleEndian.Uint64(q[12:])}
		if p.Offset+p.Length < p.Offset || total+p.Length < total {
			return nil, 0, transport.Errorf(transport.ErrCorrupt, "piece %d of the write wraps around", i)
		}
		total += p.Length
		pieces[i] = p
	}
	return pieces, total, nil
}

func encodeChunk(slot uint32, n uint64) []byte {
	b := append(make([]byte, 0, chunkLen), chunkMagic...)
	b = binary.LittleEndian.AppendUint32(b, slot)
	return binary.LittleEndian.AppendUint64(b, n)
}

func decodeChunk(b []byte) (slot uint32, n uint64, err error) {
	if len(b) != chunkLen || string(b[:4]) != chunkMagic {
		return 0, 0, transport.Errorf(transport.ErrCorrupt, "malformed write chunk")
	}
	return binary.LittleEndian.Uint32(b[4:]), binary.LittleEndian.Uint64(b[8:]), nil
}

// decodeWriteReply reads the fixed part of a reply to a write request or
// chunk: no bytes inline, a descriptor only with a request's OK.
func decodeWriteReply(b []byte) (replyHeader, error) { return decodeReply(b, "owner", flagStaging) }
