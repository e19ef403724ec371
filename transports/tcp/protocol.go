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
//	request    "RTQ1", object [16], tensor u32, tensors u32, offset u64,
//	           length u64, tag u64, sizes u64
//	write      "RTW1", object [16], tensor u32, 0 u32, offset u64,
//	           length u64, tag u64, write id u64, then the length bytes
//	response   status i32, message length u32, tag u64, message, then the bytes
//	           (none for a write: its answer comes once its bytes are in place)
//
// A write lands bytes in a range of one tensor of an object its owner
// exposed for writing, on behalf of a write the owner admitted over the
// control plane (with the writable ref's key): the write id is the
// writer's transfer id of that write, and the server takes the bytes only
// while that write is open and only inside the ranges it was admitted for
// (Host.WriteInto). A refused write's bytes are read and dropped, so the
// connection stays framed. A write frame asks for at most maxWrite bytes.
//
// A request asks for a byte range of one tensor (tensors 0 or 1), or for a
// run of whole tensors, `tensors` of them from `tensor` on (offset 0),
// their bytes laid end to end: views of one buffer fetched into views of
// another are one request and one answer, not one per tensor. `sizes` is
// the receiver's digest of the run's tensor sizes (sizeDigest), which the
// source checks against its own, so that a run whose tensors do not split
// where the receiver's targets do is refused, as a range outside its
// tensor is, rather than landing shifted. A run crosses at most
// maxRunTensors tensors, so that what one request costs the source stays
// bounded.
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
	protoVersion = 5 // 3: requests carry a tag that answers echo; 4: a request may ask for a run of tensors; 5: writes
	nonceLen     = 32
	proofLen     = 32
	helloLen     = len(helloMagic) + 1 + nonceLen
	clientLen    = proofLen + len(transport.RuntimeID{}) // the client's handshake answer
	requestMagic = "RTQ1"
	writeMagic   = "RTW1"
	requestLen   = 4 + 16 + 4 + 4 + 8 + 8 + 8 + 8
	responseLen  = 4 + 4 + 8
	// maxChunk bounds the bytes one request may ask for; clients cut
	// tensors into pieces no larger (and pipeline them, so the size costs
	// no round trips).
	maxChunk = 64 << 20
	// maxWrite bounds the bytes one write frame carries: the server holds
	// the write busy while it reads them, and drops them when it refuses.
	maxWrite = 8 << 20
	// maxRunTensors bounds the tensors one request's range may cross.
	maxRunTensors = 4096
	// maxMessage bounds an error message on the wire.
	maxMessage  = 4096
	authPurpose = "rdt-tcp-data"
)

// request asks for a byte range of one tensor of an object, or for a run
// of Tensors whole tensors whose sizes digest to Sizes. Tag is the
// client's: the answer echoes it.
type request struct {
	Object         transport.ObjectID
	Tensor         uint32
	Tensors        uint32
	Offset, Length uint64
	Tag            uint64
	Sizes          uint64 // a read's; a write carries its write id here
	Write          bool   // a write frame: Length bytes follow it
}

// sizeDigest folds the size of the next tensor of a run into a digest
// (FNV-1a over its 8 bytes, starting from sizeDigestStart). It catches a
// mismatch, not an attacker: the source's bytes are the receiver's to
// read anyway.
func sizeDigest(h, size uint64) uint64 {
	for i := 0; i < 8; i++ {
		h ^= size & 0xff
		h *= 1099511628211
		size >>= 8
	}
	return h
}

const sizeDigestStart = 14695981039346656037

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
	if r.Write {
		b = append(b, writeMagic...)
	} else {
		b = append(b, requestMagic...)
	}
	b = append(b, r.Object[:]...)
	b = binary.LittleEndian.AppendUint32(b, r.Tensor)
	b = binary.LittleEndian.AppendUint32(b, r.Tensors)
	b = binary.LittleEndian.AppendUint64(b, r.Offset)
	b = binary.LittleEndian.AppendUint64(b, r.Length)
	b = binary.LittleEndian.AppendUint64(b, r.Tag)
	b = binary.LittleEndian.AppendUint64(b, r.Sizes)
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
	switch string(b[:4]) {
	case requestMagic:
	case writeMagic:
		r.Write = true
	default:
		return r, transport.Errorf(transport.ErrInvalidArgument, "bad request magic %q", b[:4])
	}
	copy(r.Object[:], b[4:20])
	r.Tensor = binary.LittleEndian.Uint32(b[20:])
	r.Tensors = binary.LittleEndian.Uint32(b[24:])
	r.Offset = binary.LittleEndian.Uint64(b[28:])
	r.Length = binary.LittleEndian.Uint64(b[36:])
	r.Tag = binary.LittleEndian.Uint64(b[44:])
	r.Sizes = binary.LittleEndian.Uint64(b[52:])
	if r.Write && (r.Tensors > 1 || r.Length > maxWrite) {
		// The bytes that follow cannot be skipped safely: not framed.
		return r, transport.Errorf(transport.ErrInvalidArgument, "a write frame of %d bytes into %d tensors (at most %d bytes, one tensor)", r.Length, r.Tensors, maxWrite)
	}
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
