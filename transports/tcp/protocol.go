package tcp

import (
	"encoding/binary"
	"math/rand/v2"

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
//	           server → client: response header with tag 0
//	                            (OK or PERMISSION_DENIED + message)
//	request    "RTQ1", object [16], tensor u32, reserved u32, offset u64,
//	           length u64, tag u64
//	response   status i32, message length u32, tag u64, message, then the bytes
//
// The tag binds an answer to its request: the client draws a fresh random
// non-zero tag for every request, the server echoes it in the answer's
// header (the answer to a malformed frame echoes whatever the frame held
// there), and a client that reads a header whose tag is not the one of the
// request it expects next takes the stream as corrupt (ErrCorrupt) and
// closes the connection. Bytes a source sends that nobody asked for (say,
// late, after its last answer, while the connection sat in the pool) thus
// never pass for the answer to a later request: that header was written
// before the source could know the tag. The receiver also checks, without
// blocking, that a pooled connection holds no unread byte and no EOF before
// it reuses one.
//
// The key is the configured token, or without one a key derived from the
// source runtime's random secret, which receivers learn from the metadata.
// The runtime id is not proven: the server uses it only to close that
// peer's connections once the peer is gone.

const (
	helloMagic   = "RTCPDATA"
	protoVersion = 3 // 3: requests carry a tag that answers echo
	nonceLen     = 32
	proofLen     = 32
	helloLen     = len(helloMagic) + 1 + nonceLen
	clientLen    = proofLen + len(transport.RuntimeID{}) // the client's handshake answer
	requestMagic = "RTQ1"
	requestLen   = 4 + 16 + 4 + 4 + 8 + 8 + 8
	responseLen  = 4 + 4 + 8
	// maxChunk bounds the bytes one request may ask for; clients cut
	// tensors into pieces no larger (and pipeline them, so the size costs
	// no round trips).
	maxChunk = 64 << 20
	// maxMessage bounds an error message on the wire.
	maxMessage  = 4096
	authPurpose = "rdt-tcp-data"
)

// request asks for a byte range of one tensor of an object. Tag is the
// client's: the answer echoes it.
type request struct {
	Object         transport.ObjectID
	Tensor         uint32
	Offset, Length uint64
	Tag            uint64
}

// newTag draws a request tag: random, so that a header written before the
// source read the request (bytes left over from an earlier answer, or sent
// ahead of time) matches it only by chance (2^-64), and never 0, the tag of
// the handshake's answer. The tag frames answers; it authenticates nothing
// (the connection is authenticated, and the source owns the bytes anyway).
// math/rand/v2's generator is the runtime's ChaCha8, seeded from the
// system: nanoseconds a tag, no lock, no system call.
func newTag() uint64 {
	for {
		if t := rand.Uint64(); t != 0 {
			return t
		}
	}
}

func (r *request) encode(b []byte) []byte {
	b = append(b, requestMagic...)
	b = append(b, r.Object[:]...)
	b = binary.LittleEndian.AppendUint32(b, r.Tensor)
	b = binary.LittleEndian.AppendUint32(b, 0)
	b = binary.LittleEndian.AppendUint64(b, r.Offset)
	b = binary.LittleEndian.AppendUint64(b, r.Length)
	b = binary.LittleEndian.AppendUint64(b, r.Tag)
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
	r.Tag = binary.LittleEndian.Uint64(b[44:])
	return r, nil
}

// frameTag is the tag field of a request frame of the right length, valid
// or not: the answer to a malformed frame echoes it.
func frameTag(b []byte) uint64 {
	if len(b) != requestLen {
		return 0
	}
	return binary.LittleEndian.Uint64(b[44:])
}

// encodeResponse appends a response header answering the request tagged
// tag (0 in the handshake), and its message.
func encodeResponse(b []byte, tag uint64, st transport.Status, msg string) []byte {
	if len(msg) > maxMessage {
		msg = msg[:maxMessage]
	}
	b = binary.LittleEndian.AppendUint32(b, uint32(int32(st)))
	b = binary.LittleEndian.AppendUint32(b, uint32(len(msg)))
	b = binary.LittleEndian.AppendUint64(b, tag)
	return append(b, msg...)
}

// decodeResponseHeader returns the status, the length of the message that
// follows and the tag of the request answered. The caller checks the tag.
func decodeResponseHeader(b []byte) (transport.Status, int, uint64, error) {
	st := transport.Status(int32(binary.LittleEndian.Uint32(b)))
	n := binary.LittleEndian.Uint32(b[4:])
	tag := binary.LittleEndian.Uint64(b[8:])
	if n > maxMessage {
		return 0, 0, 0, transport.Errorf(transport.ErrCorrupt, "response message of %d bytes exceeds the limit", n)
	}
	if st != transport.OK && (st > 0 || st < transport.ErrUser) {
		return 0, 0, 0, transport.Errorf(transport.ErrCorrupt, "response carries unknown status %d", st)
	}
	return st, int(n), tag, nil
}
