package core

import (
	"crypto/ed25519"
	"encoding/binary"
	"io"
	"slices"
)

// Control-plane frames on a Unix or TCP connection:
//
//	length u32 | kind u8 | request id u64 | body
//
// length counts everything after itself and is bounded by maxFrame, and
// during the handshake by maxPreAuthFrame. The handshake (hello, challenge,
// auth, welcome, refused) comes first; then requests carry a non-zero id
// that their response repeats, and one-way messages (unborrow, cancel, ping)
// carry id 0. Every field of every body is bounded and validated by
// decodeMessage.

const (
	controlMagic   = "RDTC"
	controlVersion = 2
	maxFrame       = maxMetadataBytes + 1<<20
	frameHeader    = 4 + 1 + 8
	maxMessageText = 64 << 10
	maxRefusalText = 1 << 10
	maxNameLen     = 256
	maxAdverts     = 64
	maxAdvertDevs  = 8

	// maxPeerInfo is the largest encoded PeerInfo decodeMessage accepts.
	maxPeerInfo = 16 + 2 + maxNameLen + 2 + maxAddressLen + 2 + maxHostIDLen + 4 + 4 +
		maxAdverts*(1+63+1+1+maxAdvertDevs*4)
	// maxPreAuthFrame bounds every frame of the handshake (length excluded):
	// the largest, auth, holds a proof, a key, a signature and a PeerInfo.
	// Before a peer proved anything, nothing bigger is read.
	maxPreAuthFrame = frameHeader - 4 + max(
		4+2+nonceSize, // hello
		nonceSize+proofSize+ed25519.PublicKeySize+ed25519.SignatureSize,   // challenge
		proofSize+ed25519.PublicKeySize+ed25519.SignatureSize+maxPeerInfo, // auth
		maxPeerInfo,        // welcome
		4+4+maxRefusalText) // refused
)

type kind uint8

const (
	kindHello kind = iota + 1
	kindChallenge
	kindAuth
	kindWelcome
	kindRefused
	kindResponse
	kindIdentity
	kindBorrow
	kindUnborrow
	kindLease
	kindMetadata
	kindSend
	kindCancel
	kindPing
	kindPong
	kindGroupJoin
	kindEnd // not a kind: the first invalid value
)

var kindNames = [...]string{"", "hello", "challenge", "auth", "welcome", "refused", "response",
	"identity", "borrow", "unborrow", "lease", "metadata", "send", "cancel", "ping", "pong", "group join"}

func (k kind) String() string {
	if k > 0 && k < kindEnd {
		return kindNames[k]
	}
	return "unknown"
}

// message is one decoded frame; which fields are meaningful depends on kind.
type message struct {
	kind  kind
	id    uint64
	nonce []byte   // hello, challenge
	proof []byte   // challenge, auth: the token proof
	key   []byte   // challenge, auth: the sender's public identity key
	sig   []byte   // challenge, auth: its signature of the handshake transcript
	peer  PeerInfo // auth, welcome; identity responses
	// Response and refusal.
	status Status
	text   string
	data   []byte // response payload (metadata)
	token  uint64 // borrow, lease response
	// Requests.
	object     ObjectID
	count      uint64 // unborrow
	transport  string
	transferID uint64
	target     uint64 // cancel: the request id to cancel
	group      GroupJoin
}

func (w *writer) peerInfo(p PeerInfo) {
	w.raw(p.RuntimeID[:])
	w.str16(p.Name)
	w.str16(p.Address)
	w.str16(p.HostID)
	w.u32(uint32(p.Pid))
	w.u32(uint32(len(p.Transports)))
	for _, a := range p.Transports {
		w.str8(a.Name)
		if a.OneSided {
			w.u8(1)
		} else {
			w.u8(0)
		}
		w.u8(uint8(len(a.Devices)))
		for _, d := range a.Devices {
			w.i32(int32(d))
		}
	}
}

func (r *reader) peerInfo() PeerInfo {
	var p PeerInfo
	p.RuntimeID = r.id()
	p.Name = r.str16("peer name", maxNameLen)
	p.Address = r.str16("peer address", maxAddressLen)
	p.HostID = r.str16("peer host id", maxHostIDLen)
	p.Pid = int(r.u32())
	n := r.count("transport advert", maxAdverts, 3)
	for i := 0; i < n && r.err == nil; i++ {
		var a TransportAdvert
		a.Name = r.str8("transport name", 63)
		if canon, err := CanonicalName(a.Name); r.err == nil && (err != nil || canon != a.Name) {
			r.fail("advertised transport %q is not a canonical name", a.Name)
		}
		switch r.u8() {
		case 0:
		case 1:
			a.OneSided = true
		default:
			r.fail("bad one-sided flag")
		}
		nd := int(r.u8())
		if nd > maxAdvertDevs {
			r.fail("transport %q advertises %d device types, over %d", a.Name, nd, maxAdvertDevs)
		}
		for j := 0; j < nd && r.err == nil; j++ {
			a.Devices = append(a.Devices, DeviceType(r.i32()))
		}
		p.Transports = append(p.Transports, a)
	}
	if r.err == nil && p.RuntimeID.IsZero() {
		r.fail("zero runtime id")
	}
	return p
}

// encode makes the frame for m, length prefix included.
func (m *message) encode() []byte {
	w := &writer{b: make([]byte, frameHeader, 64+len(m.data))}
	switch m.kind {
	case kindHello:
		w.raw([]byte(controlMagic))
		w.u16(controlVersion)
		w.raw(m.nonce)
	case kindChallenge:
		w.raw(m.nonce)
		w.raw(m.proof)
		w.raw(m.key)
		w.raw(m.sig)
	case kindAuth:
		w.raw(m.proof)
		w.raw(m.key)
		w.raw(m.sig)
		w.peerInfo(m.peer)
	case kindWelcome:
		w.peerInfo(m.peer)
	case kindRefused:
		w.i32(int32(m.status))
		text := m.text
		if len(text) > maxRefusalText {
			text = text[:maxRefusalText]
		}
		w.bytes32([]byte(text))
	case kindResponse:
		w.i32(int32(m.status))
		w.bytes32([]byte(m.text))
		w.u64(m.token)
		w.bytes32(m.data)
		if m.peer.RuntimeID.IsZero() {
			w.u8(0)
		} else {
			w.u8(1)
			w.peerInfo(m.peer)
		}
	case kindIdentity, kindPing, kindPong:
	case kindBorrow:
		w.raw(m.object[:])
		w.u64(m.token)
	case kindUnborrow:
		w.raw(m.object[:])
		w.u64(m.count)
	case kindLease:
		w.raw(m.object[:])
	case kindMetadata:
		w.raw(m.object[:])
		w.str8(m.transport)
	case kindSend:
		w.raw(m.object[:])
		w.u64(m.transferID)
		w.str8(m.transport)
		w.bytes32(m.data)
	case kindCancel:
		w.u64(m.target)
	case kindGroupJoin:
		w.str8(m.group.Name)
		w.str8(m.group.Backend)
		w.u32(uint32(m.group.WorldSize))
		w.u32(uint32(m.group.Rank))
	}
	b := w.b
	binary.LittleEndian.PutUint32(b[0:4], uint32(len(b)-4))
	b[4] = byte(m.kind)
	binary.LittleEndian.PutUint64(b[5:13], m.id)
	return b
}

const nonceSize = 32
const proofSize = 32

// decodeMessage parses one frame body (everything after the length).
func decodeMessage(b []byte) (*message, error) {
	r := &reader{b: b, what: "control message"}
	m := &message{kind: kind(r.u8()), id: r.u64()}
	if r.err != nil {
		return nil, r.err
	}
	switch m.kind {
	case kindHello:
		if string(r.take(4)) != controlMagic && r.err == nil {
			r.fail("bad magic: not an rdt peer")
		}
		if v := r.u16(); r.err == nil && v != controlVersion {
			r.fail("protocol version %d is not supported (this runtime speaks %d)", v, controlVersion)
		}
		m.nonce = append([]byte(nil), r.take(nonceSize)...)
	case kindChallenge:
		m.nonce = append([]byte(nil), r.take(nonceSize)...)
		m.proof = append([]byte(nil), r.take(proofSize)...)
		m.key = append([]byte(nil), r.take(ed25519.PublicKeySize)...)
		m.sig = append([]byte(nil), r.take(ed25519.SignatureSize)...)
	case kindAuth:
		m.proof = append([]byte(nil), r.take(proofSize)...)
		m.key = append([]byte(nil), r.take(ed25519.PublicKeySize)...)
		m.sig = append([]byte(nil), r.take(ed25519.SignatureSize)...)
		m.peer = r.peerInfo()
	case kindWelcome:
		m.peer = r.peerInfo()
	case kindRefused:
		m.status = Status(r.i32())
		m.text = string(r.bytes32("message", maxRefusalText))
	case kindResponse:
		m.status = Status(r.i32())
		m.text = string(r.bytes32("message", maxMessageText))
		m.token = r.u64()
		m.data = r.bytes32("payload", maxMetadataBytes)
		switch r.u8() {
		case 0:
		case 1:
			m.peer = r.peerInfo()
		default:
			r.fail("bad identity flag")
		}
	case kindIdentity, kindPing, kindPong:
	case kindBorrow:
		m.object = r.id()
		m.token = r.u64()
	case kindUnborrow:
		m.object = r.id()
		m.count = r.u64()
	case kindLease:
		m.object = r.id()
	case kindMetadata:
		m.object = r.id()
		m.transport = r.str8("transport", 63)
	case kindSend:
		m.object = r.id()
		m.transferID = r.u64()
		m.transport = r.str8("transport", 63)
		m.data = r.bytes32("communicator metadata", maxMetadataBytes)
	case kindCancel:
		m.target = r.u64()
	case kindGroupJoin:
		m.group.Name = r.str8("group name", 127)
		m.group.Backend = r.str8("group backend", 63)
		m.group.WorldSize = int(r.u32())
		m.group.Rank = int(r.u32())
		if r.err == nil {
			if err := CheckGroupName(m.group.Name); err != nil {
				r.fail("%v", err)
			} else if canon, err := CanonicalName(m.group.Backend); err != nil || canon != m.group.Backend {
				r.fail("group backend %q is not a canonical transport name", m.group.Backend)
			} else if m.group.WorldSize < 1 || m.group.WorldSize > MaxGroupSize || m.group.Rank >= m.group.WorldSize {
				r.fail("group rank %d of %d is out of range", m.group.Rank, m.group.WorldSize)
			}
		}
	default:
		r.fail("unknown message kind %d", m.kind)
	}
	if err := r.done(); err != nil {
		return nil, err
	}
	if ((m.kind >= kindIdentity && m.kind <= kindSend && m.kind != kindUnborrow) || m.kind == kindGroupJoin) && m.id == 0 {
		return nil, Errorf(ErrCorrupt, "control message: %s request without an id", m.kind)
	}
	if m.transport != "" {
		if canon, err := CanonicalName(m.transport); err != nil || canon != m.transport {
			return nil, Errorf(ErrCorrupt, "control message: transport %q is not a canonical name", m.transport)
		}
	}
	return m, nil
}

// frameChunk is how much of a frame body is read before its buffer grows.
const frameChunk = 64 << 10

// readFrame reads one length-prefixed frame body of at most limit bytes
// into buf. A buffer too small grows as the bytes arrive, doubling, so a
// length prefix alone never costs more than frameChunk: memory follows what
// the peer actually sent.
func readFrame(rd io.Reader, buf []byte, limit uint32) ([]byte, error) {
	var hdr [4]byte
	if _, err := io.ReadFull(rd, hdr[:]); err != nil {
		return nil, err
	}
	n := binary.LittleEndian.Uint32(hdr[:])
	if n < frameHeader-4 || n > limit {
		return nil, Errorf(ErrCorrupt, "control message: frame of %d bytes is outside %d..%d", n, frameHeader-4, limit)
	}
	want := int(n)
	if cap(buf) >= want {
		buf = buf[:want]
		if _, err := io.ReadFull(rd, buf); err != nil {
			return nil, err
		}
		return buf, nil
	}
	buf = buf[:0]
	for len(buf) < want {
		chunk := min(want-len(buf), max(len(buf), frameChunk))
		buf = slices.Grow(buf, chunk)
		start := len(buf)
		buf = buf[:start+chunk]
		if _, err := io.ReadFull(rd, buf[start:]); err != nil {
			return nil, err
		}
	}
	return buf, nil
}
