package control

import (
	"crypto/ed25519"

	"github.com/rdt-project/rdt/core/transport"
)

// One codec per kind: the body's layout, what each field is bounded by,
// and the checks of its values. The frame header and the checks shared by
// every kind (trailing bytes, a request's id, a transport's name) are in
// message.go.

// codec is how one kind's body crosses the wire. encode appends m's body;
// decode reads one into m, recording the first error in r, with every
// length and count from the peer bounded before it allocates. request
// says the kind is a request, whose id must not be zero.
type codec struct {
	encode  func(w *transport.WireWriter, m *Message)
	decode  func(r *transport.WireReader, m *Message)
	request bool
}

// codecs is indexed by Kind; kind 0 has none. KindEnd sizes it, so a new
// kind without a codec is a hole that TestEveryKindHasACodec reports.
var codecs = [KindEnd]codec{
	KindHello:          {encode: encodeHello, decode: decodeHello},
	KindChallenge:      {encode: encodeChallenge, decode: decodeChallenge},
	KindAuth:           {encode: encodeAuth, decode: decodeAuth},
	KindWelcome:        {encode: encodeWelcome, decode: decodeWelcome},
	KindRefused:        {encode: encodeRefused, decode: decodeRefused},
	KindResponse:       {encode: encodeResponse, decode: decodeResponse},
	KindIdentity:       {encode: encodeEmpty, decode: decodeEmpty, request: true},
	KindBorrow:         {encode: encodeBorrow, decode: decodeBorrow, request: true},
	KindUnborrow:       {encode: encodeUnborrow, decode: decodeUnborrow},
	KindLease:          {encode: encodeLease, decode: decodeLease, request: true},
	KindMetadata:       {encode: encodeMetadata, decode: decodeMetadata, request: true},
	KindSend:           {encode: encodeSend, decode: decodeSend, request: true},
	KindCancel:         {encode: encodeCancel, decode: decodeCancel},
	KindPing:           {encode: encodeCount, decode: decodeCount},
	KindPong:           {encode: encodeCount, decode: decodeCount},
	KindGroupJoin:      {encode: encodeGroupJoin, decode: decodeGroupJoin, request: true},
	KindClosing:        {encode: encodeEmpty, decode: decodeEmpty},
	KindWriteOpen:      {encode: encodeWriteOpen, decode: decodeWriteOpen, request: true},
	KindWriteDone:      {encode: encodeWriteDone, decode: decodeWriteDone},
	KindWriteWithdrawn: {encode: encodeWriteWithdrawn, decode: decodeWriteWithdrawn},
	KindWriteRun:       {encode: encodeWriteRun, decode: decodeWriteRun},
}

// codecOf is kind's codec, or nil for a kind that has none.
func codecOf(k Kind) *codec {
	if k >= KindEnd || codecs[k].decode == nil {
		return nil
	}
	return &codecs[k]
}

// take reads a copy of the next n bytes (nil once r failed).
func take(r *transport.WireReader, n int) []byte {
	return append([]byte(nil), r.Take(n)...)
}

// Hello: magic | version u16 | nonce.
func encodeHello(w *transport.WireWriter, m *Message) {
	w.Raw([]byte(controlMagic))
	w.U16(controlVersion)
	w.Raw(m.Nonce)
}

func decodeHello(r *transport.WireReader, m *Message) {
	if string(r.Take(4)) != controlMagic && r.Err() == nil {
		r.Fail("bad magic: not an rdt peer")
	}
	if v := r.U16(); r.Err() == nil && v != controlVersion {
		r.Fail("protocol version %d is not supported (this runtime speaks %d)", v, controlVersion)
	}
	m.Nonce = take(r, NonceSize)
}

// Challenge: nonce | proof | key | signature.
func encodeChallenge(w *transport.WireWriter, m *Message) {
	w.Raw(m.Nonce)
	encodeProof(w, m)
}

func decodeChallenge(r *transport.WireReader, m *Message) {
	m.Nonce = take(r, NonceSize)
	decodeProof(r, m)
}

// Auth: proof | key | signature | peer info.
func encodeAuth(w *transport.WireWriter, m *Message) {
	encodeProof(w, m)
	writePeerInfo(w, m.Peer)
}

func decodeAuth(r *transport.WireReader, m *Message) {
	decodeProof(r, m)
	m.Peer = readPeerInfo(r)
}

// encodeProof writes what proves a side of the handshake: the token's
// proof, the identity key and its signature of the transcript.
func encodeProof(w *transport.WireWriter, m *Message) {
	w.Raw(m.Proof)
	w.Raw(m.Key)
	w.Raw(m.Sig)
}

func decodeProof(r *transport.WireReader, m *Message) {
	m.Proof = take(r, ProofSize)
	m.Key = take(r, ed25519.PublicKeySize)
	m.Sig = take(r, ed25519.SignatureSize)
}

// Welcome: peer info.
func encodeWelcome(w *transport.WireWriter, m *Message) { writePeerInfo(w, m.Peer) }

func decodeWelcome(r *transport.WireReader, m *Message) { m.Peer = readPeerInfo(r) }

// Refused: status i32 | text, cut to maxRefusalText.
func encodeRefused(w *transport.WireWriter, m *Message) {
	text := m.Text
	if len(text) > maxRefusalText {
		text = text[:maxRefusalText]
	}
	writeStatus(w, m.Status, text)
}

func decodeRefused(r *transport.WireReader, m *Message) { readStatus(r, m, maxRefusalText) }

// writeStatus writes an outcome: status i32 | text.
func writeStatus(w *transport.WireWriter, status transport.Status, text string) {
	w.I32(int32(status))
	w.Bytes32([]byte(text))
}

// readStatus reads writeStatus' outcome into m, its text bounded by max.
func readStatus(r *transport.WireReader, m *Message, max int) {
	m.Status = transport.Status(r.I32())
	m.Text = string(r.Bytes32("message", max))
}

// Response: status i32 | text | token u64 | payload | identity flag u8 |
// peer info if the flag is 1.
func encodeResponse(w *transport.WireWriter, m *Message) {
	writeStatus(w, m.Status, m.Text)
	w.U64(m.Token)
	w.Bytes32(m.Data)
	if m.Peer.RuntimeID.IsZero() {
		w.U8(0)
	} else {
		w.U8(1)
		writePeerInfo(w, m.Peer)
	}
}

func decodeResponse(r *transport.WireReader, m *Message) {
	readStatus(r, m, maxMessageText)
	m.Token = r.U64()
	m.Data = r.Bytes32("payload", MaxMetadataBytes)
	switch r.U8() {
	case 0:
	case 1:
		m.Peer = readPeerInfo(r)
	default:
		r.Fail("bad identity flag")
	}
}

// Identity, closing: no body.
func encodeEmpty(*transport.WireWriter, *Message) {}

func decodeEmpty(*transport.WireReader, *Message) {}

// Ping, pong: the bytes of frames the sender has read, u64.
func encodeCount(w *transport.WireWriter, m *Message) { w.U64(m.Count) }

func decodeCount(r *transport.WireReader, m *Message) { m.Count = r.U64() }

// Borrow: object | token u64.
func encodeBorrow(w *transport.WireWriter, m *Message) { writeObjectU64(w, m.Object, m.Token) }

func decodeBorrow(r *transport.WireReader, m *Message) { m.Object, m.Token = r.ID(), r.U64() }

// Unborrow: object | count u64.
func encodeUnborrow(w *transport.WireWriter, m *Message) { writeObjectU64(w, m.Object, m.Count) }

func decodeUnborrow(r *transport.WireReader, m *Message) { m.Object, m.Count = r.ID(), r.U64() }

func writeObjectU64(w *transport.WireWriter, obj transport.ObjectID, v uint64) {
	w.Raw(obj[:])
	w.U64(v)
}

// Lease: object.
func encodeLease(w *transport.WireWriter, m *Message) { w.Raw(m.Object[:]) }

func decodeLease(r *transport.WireReader, m *Message) { m.Object = r.ID() }

// Metadata: object | transport str8.
func encodeMetadata(w *transport.WireWriter, m *Message) {
	w.Raw(m.Object[:])
	w.Str8(m.Transport)
}

func decodeMetadata(r *transport.WireReader, m *Message) {
	m.Object, m.Transport = r.ID(), r.Str8("transport", 63)
}

// writeTransfer starts the bodies of send and the write messages: object
// | transfer id u64, and for send and write open the transport, str8.
func writeTransfer(w *transport.WireWriter, m *Message, named bool) {
	w.Raw(m.Object[:])
	w.U64(m.TransferID)
	if named {
		w.Str8(m.Transport)
	}
}

func readTransfer(r *transport.WireReader, m *Message, named bool) {
	m.Object = r.ID()
	m.TransferID = r.U64()
	if named {
		m.Transport = r.Str8("transport", 63)
	}
}

// Send: object | transfer id u64 | transport str8 | communicator metadata
// | pieces (absent for a whole fetch).
func encodeSend(w *transport.WireWriter, m *Message) {
	writeTransfer(w, m, true)
	w.Bytes32(m.Data)
	writePieces(w, m.Pieces)
}

func decodeSend(r *transport.WireReader, m *Message) {
	readTransfer(r, m, true)
	m.Data = r.Bytes32("communicator metadata", MaxMetadataBytes)
	m.Pieces = readPieces(r)
}

// Write open: object | transfer id u64 | transport str8 | write key |
// tag u64 | flags u8 | pieces (absent for a whole object).
func encodeWriteOpen(w *transport.WireWriter, m *Message) {
	writeTransfer(w, m, true)
	w.Raw(m.WriteKey[:])
	w.U64(m.Token)
	w.U8(m.Flags)
	writePieces(w, m.Pieces)
}

func decodeWriteOpen(r *transport.WireReader, m *Message) {
	readTransfer(r, m, true)
	copy(m.WriteKey[:], r.Take(len(m.WriteKey)))
	m.Token = r.U64()
	m.Flags = r.U8()
	if m.Flags&^WriteStanding != 0 && r.Err() == nil {
		r.Fail("bad write open flags %#x", m.Flags)
	}
	m.Pieces = readPieces(r)
}

// Write done: object | transfer id u64 | status i32 | text | tag u64 |
// flags u8.
func encodeWriteDone(w *transport.WireWriter, m *Message) {
	encodeWriteWithdrawn(w, m)
	w.U64(m.Token)
	w.U8(m.Flags)
}

func decodeWriteDone(r *transport.WireReader, m *Message) {
	decodeWriteWithdrawn(r, m)
	m.Token = r.U64()
	m.Flags = r.U8()
	if (m.Flags&^(WriteKeep|WriteClose) != 0 || m.Flags == WriteKeep|WriteClose) && r.Err() == nil {
		r.Fail("bad write done flags %#x", m.Flags)
	}
}

// Write withdrawn: object | transfer id u64 | status i32 | text; write
// done begins the same.
func encodeWriteWithdrawn(w *transport.WireWriter, m *Message) {
	writeTransfer(w, m, false)
	writeStatus(w, m.Status, m.Text)
}

func decodeWriteWithdrawn(r *transport.WireReader, m *Message) {
	readTransfer(r, m, false)
	readStatus(r, m, maxMessageText)
}

// Write run: object | transfer id u64 | tag u64.
func encodeWriteRun(w *transport.WireWriter, m *Message) {
	writeTransfer(w, m, false)
	w.U64(m.Token)
}

func decodeWriteRun(r *transport.WireReader, m *Message) {
	readTransfer(r, m, false)
	m.Token = r.U64()
}

// Cancel: the id of the request to cancel, u64.
func encodeCancel(w *transport.WireWriter, m *Message) { w.U64(m.Target) }

func decodeCancel(r *transport.WireReader, m *Message) { m.Target = r.U64() }

// Group join: name str8 | backend str8 | world size u32 | rank u32.
func encodeGroupJoin(w *transport.WireWriter, m *Message) {
	w.Str8(m.Group.Name)
	w.Str8(m.Group.Backend)
	w.U32(uint32(m.Group.WorldSize))
	w.U32(uint32(m.Group.Rank))
}

func decodeGroupJoin(r *transport.WireReader, m *Message) {
	g := &m.Group
	g.Name = r.Str8("group name", 127)
	g.Backend = r.Str8("group backend", 63)
	g.WorldSize = int(r.U32())
	g.Rank = int(r.U32())
	if r.Err() != nil {
		return
	}
	if err := transport.CheckGroupName(g.Name); err != nil {
		r.Fail("%v", err)
	} else if canon, err := transport.CanonicalName(g.Backend); err != nil || canon != g.Backend {
		r.Fail("group backend %q is not a canonical transport name", g.Backend)
	} else if g.WorldSize < 1 || g.WorldSize > transport.MaxGroupSize || g.Rank >= g.WorldSize {
		r.Fail("group rank %d of %d is out of range", g.Rank, g.WorldSize)
	}
}

// writePeerInfo writes a runtime's identity: runtime id | name str16 |
// address str16 | host id str16 | pid u32 | adverts u32, each a name
// str8, a one-sided flag u8 and its device types, u8 then i32 each.
func writePeerInfo(w *transport.WireWriter, p transport.PeerInfo) {
	w.Raw(p.RuntimeID[:])
	w.Str16(p.Name)
	w.Str16(p.Address)
	w.Str16(p.HostID)
	w.U32(uint32(p.Pid))
	w.U32(uint32(len(p.Transports)))
	for _, a := range p.Transports {
		w.Str8(a.Name)
		if a.OneSided {
			w.U8(1)
		} else {
			w.U8(0)
		}
		w.U8(uint8(len(a.Devices)))
		for _, d := range a.Devices {
			w.I32(int32(d))
		}
	}
}

func readPeerInfo(r *transport.WireReader) transport.PeerInfo {
	var p transport.PeerInfo
	p.RuntimeID = r.ID()
	p.Name = r.Str16("peer name", MaxNameLen)
	p.Address = r.Str16("peer address", MaxAddressLen)
	p.HostID = r.Str16("peer host id", MaxHostIDLen)
	p.Pid = int(r.U32())
	n := r.Count("transport advert", maxAdverts, 3)
	for i := 0; i < n && r.Err() == nil; i++ {
		p.Transports = append(p.Transports, readAdvert(r))
	}
	if r.Err() == nil && p.RuntimeID.IsZero() {
		r.Fail("zero runtime id")
	}
	return p
}

func readAdvert(r *transport.WireReader) transport.TransportAdvert {
	var a transport.TransportAdvert
	a.Name = r.Str8("transport name", 63)
	if canon, err := transport.CanonicalName(a.Name); r.Err() == nil && (err != nil || canon != a.Name) {
		r.Fail("advertised transport %q is not a canonical name", a.Name)
	}
	switch r.U8() {
	case 0:
	case 1:
		a.OneSided = true
	default:
		r.Fail("bad one-sided flag")
	}
	nd := int(r.U8())
	if nd > maxAdvertDevs {
		r.Fail("transport %q advertises %d device types, over %d", a.Name, nd, maxAdvertDevs)
	}
	for j := 0; j < nd && r.Err() == nil; j++ {
		a.Devices = append(a.Devices, transport.DeviceType(r.I32()))
	}
	return a
}

// writePieces writes a trailing section of pieces, absent when there are
// none (a whole object), so that whole requests read the same in every
// version: count u32, then tensor u32 | offset u64 | length u64 each.
func writePieces(w *transport.WireWriter, pieces []transport.Piece) {
	if pieces == nil {
		return
	}
	w.U32(uint32(len(pieces)))
	for _, p := range pieces {
		w.U32(p.Tensor)
		w.U64(p.Offset)
		w.U64(p.Length)
	}
}

// readPieces reads writePieces' section, if present.
func readPieces(r *transport.WireReader) []transport.Piece {
	if r.Len() == 0 {
		return nil
	}
	n := r.Count("piece", transport.MaxTensors, pieceSize)
	pieces := make([]transport.Piece, 0, n)
	for i := 0; i < n && r.Err() == nil; i++ {
		pieces = append(pieces, transport.Piece{Tensor: r.U32(), Offset: r.U64(), Length: r.U64()})
	}
	return pieces
}

// pieceSize is a piece's size on the wire.
const pieceSize = 4 + 8 + 8
