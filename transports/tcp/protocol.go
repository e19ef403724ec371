package tcp

import (
	"encoding/binary"

	"github.com/rdt-project/rdt/core/transport"
)

// The data protocol. After the handshake a connection carries requests:
// the client sends fixed-size request frames (several may be in flight; the
// server answers them in order) and the server answers each with a response
// header, then (when the status is OK) exactly the requested bytes. Little
// endian throughout.
//
//	handshake  server → client: "RTCPDATA", version u8, nonce [32]
//	           client → server: proof [32] (HMAC of the key over the nonce),
//	                            runtime id [16] (the client's, zero if none)
//	           server → client: response header (OK or PERMISSION_DENIED + message)
//	request    "RTQ1", object [16], tensor u32, reserved u32, offset u64, length u64
//	response   status i32, message length u32, message, then the bytes
//
// The key is the configured token, or without one a key derived from the
// source runtime's random secret, which receivers learn from the metadata.
// The runtime id is not proven: the server uses it only to close that
// peer's connections once the peer is gone.

const (
	helloMagic   = "RTCPDATA"
	protoVersion = 2
	nonceLen     = 32
	proofLen     = 32
	helloLen     = len(helloMagic) + 1 + nonceLen
	clientLen    = proofLen + len(transport.RuntimeID{}) // the client's handshake answer
	requestMagic = "RTQ1"
	requestLen   = 4 + 16 + 4 + 4 + 8 + 8
	responseLen  = 4 + 4
	// maxChunk bounds the bytes one request may ask for; clients cut
	// tensors into pieces no larger (and pipeline them, so the size costs
	// no round trips).
	maxChunk = 64 << 20
	// maxMessage bounds an error message on the wire.
	maxMessage  = 4096
	authPurpose = "rdt-tcp-data"
)

// request asks for a byte range of one tensor of an object.
type request struct {
	Object         transport.ObjectID
	Tensor         uint32
	Offset, Length uint64
}

func (r *request) encode(b []byte) []byte {
	b = append(b, requestMagic...)
	b = append(b, r.Object[:]...)
	b = binary.LittleEndian.AppendUint32(b, r.Tensor)
	b = binary.LittleEndian.AppendUint32(b, 0)
	b = binary.LittleEndian.AppendUint64(b, r.Offset)
	b = binary.LittleEndian.AppendUint64(b, r.Length)
	return b
}

// decodeRequest parses a request frame. It checks the frame's own fields
// (an error means the stream is not framed and closes the connection); the
// server checks the range, length included, and refuses a bad one with the
// connection kept.
func decodeRequest(b []byte) (request, error) {
	var r request
	if len(b) != requestLen {
		return r, transport.Errorf(transport.ErrInvalidArgument, "request frame is %d bytes, want %d", len(b), requestLen)
	}
	if string(b[:4]) != requestMagic {
		return r, transport.Errorf(transport.ErrInvalidArgument, "bad request magic %q", b[:4])
	}
	copy(r.Object[:], b[4:20])
	r.Tensor = binary.LittleEndian.Uint32(b[20:])
	if binary.LittleEndian.Uint32(b[24:]) != 0 {
		return r, transport.Errorf(transport.ErrInvalidArgument, "reserved request field is not zero")
	}
	r.Offset = binary.LittleEndian.Uint64(b[28:])
	r.Length = binary.LittleEndian.Uint64(b[36:])
	return r, nil
}

func encodeResponse(b []byte, st transport.Status, msg string) []byte {
	if len(msg) > maxMessage {
		msg = msg[:maxMessage]
	}
	b = binary.LittleEndian.AppendUint32(b, uint32(int32(st)))
	b = binary.LittleEndian.AppendUint32(b, uint32(len(msg)))
	return append(b, msg...)
}

// decodeResponseHeader returns the status and the length of the message
// that follows.
func decodeResponseHeader(b []byte) (transport.Status, int, error) {
	st := transport.Status(int32(binary.LittleEndian.Uint32(b)))
	n := binary.LittleEndian.Uint32(b[4:])
	if n > maxMessage {
		return 0, 0, transport.Errorf(transport.ErrCorrupt, "response message of %d bytes exceeds the limit", n)
	}
	if st != transport.OK && (st > 0 || st < transport.ErrUser) {
		return 0, 0, transport.Errorf(transport.ErrCorrupt, "response carries unknown status %d", st)
	}
	return st, int(n), nil
}
