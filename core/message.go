package core

import (
	"crypto/ed25519"
	"encoding/binary"
	"io"
	"slices"

	"github.com/rdt-project/rdt/core/transport"
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
	nonce []byte             // hello, challenge
	proof []byte             // challenge, auth: the token proof
	key   []byte             // challenge, auth: the sender's public identity key
	sig   []byte             // challenge, auth: its signature of the handshake transcript
	peer  transport.PeerInfo // auth, welcome; identity responses
	// Response and refusal.
	status transport.Status
	text   string
	data   []byte // response payload (metadata)
	token  uint64 // borrow, lease response
	// Requests.
	object     transport.ObjectID
	count      uint64 // unborrow
	transport  string
	transferID uint64
	target     uint64 // cancel: the request id to cancel
	group      GroupJoin
}

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
	p.Name = r.Str16("peer name", maxNameLen)
	p.Address = r.Str16("peer address", maxAddressLen)
	p.HostID = r.Str16("peer host id", maxHostIDLen)
	p.Pid = int(r.U32())
	n := r.Count("transport advert", maxAdverts, 3)
	for i := 0; i < n && r.Err() == nil; i++ {
		var a transport.TransportAdvert
		a.Name = r.Str8("transport name", 63)
		if canon, err := CanonicalName(a.Name); r.Err() == nil && (err != nil || canon != a.Name) {
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
		p.Transports = append(p.Transports, a)
	}
	if r.Err() == nil && p.RuntimeID.IsZero() {
		r.Fail("zero runtime id")
	}
	return p
}

// encode makes the frame for m, length prefix included.
func (m *message) encode() []byte {
	w := transport.NewWireWriter(make([]byte, frameHeader, 64+len(m.data)))
	switch m.kind {
	case kindHello:
		w.Raw([]byte(controlMagic))
		w.U16(controlVersion)
		w.Raw(m.nonce)
	case kindChallenge:
		w.Raw(m.nonce)
		w.Raw(m.proof)
		w.Raw(m.key)
		w.Raw(m.sig)
	case kindAuth:
		w.Raw(m.proof)
		w.Raw(m.key)
		w.Raw(m.sig)
		writePeerInfo(w, m.peer)
	case kindWelcome:
		writePeerInfo(w, m.peer)
	case kindRefused:
		w.I32(int32(m.status))
		text := m.text
		if len(text) > maxRefusalText {
			text = text[:maxRefusalText]
		}
		w.Bytes32([]byte(text))
	case kindResponse:
		w.I32(int32(m.status))
		w.Bytes32([]byte(m.text))
		w.U64(m.token)
		w.Bytes32(m.data)
		if m.peer.RuntimeID.IsZero() {
			w.U8(0)
		} else {
			w.U8(1)
			writePeerInfo(w, m.peer)
		}
	case kindIdentity, kindPing, kindPong:
	case kindBorrow:
		w.Raw(m.object[:])
		w.U64(m.token)
	case kindUnborrow:
		w.Raw(m.object[:])
		w.U64(m.count)
	case kindLease:
		w.Raw(m.object[:])
	case kindMetadata:
		w.Raw(m.object[:])
		w.Str8(m.transport)
	case kindSend:
		w.Raw(m.object[:])
		w.U64(m.transferID)
		w.Str8(m.transport)
		w.Bytes32(m.data)
	case kindCancel:
		w.U64(m.target)
	case kindGroupJoin:
		w.Str8(m.group.Name)
		w.Str8(m.group.Backend)
		w.U32(uint32(m.group.WorldSize))
		w.U32(uint32(m.group.Rank))
	}
	b := w.Bytes()
	binary.LittleEndian.PutUint32(b[0:4], uint32(len(b)-4))
	b[4] = byte(m.kind)
	binary.LittleEndian.PutUint64(b[5:13], m.id)
	return b
}

const nonceSize = 32
const proofSize = 32

// decodeMessage parses one frame body (everything after the length).
func decodeMessage(b []byte) (*message, error) {
	r := transport.NewWireReader("control message", b)
	m := &message{kind: kind(r.U8()), id: r.U64()}
	if r.Err() != nil {
		return nil, r.Err()
	}
	switch m.kind {
	case kindHello:
		if string(r.Take(4)) != controlMagic && r.Err() == nil {
			r.Fail("bad magic: not an rdt peer")
		}
		if v := r.U16(); r.Err() == nil && v != controlVersion {
			r.Fail("protocol version %d is not supported (this runtime speaks %d)", v, controlVersion)
		}
		m.nonce = append([]byte(nil), r.Take(nonceSize)...)
	case kindChallenge:
		m.nonce = append([]byte(nil), r.Take(nonceSize)...)
		m.proof = append([]byte(nil), r.Take(proofSize)...)
		m.key = append([]byte(nil), r.Take(ed25519.PublicKeySize)...)
		m.sig = append([]byte(nil), r.Take(ed25519.SignatureSize)...)
	case kindAuth:
		m.proof = append([]byte(nil), r.Take(proofSize)...)
		m.key = append([]byte(nil), r.Take(ed25519.PublicKeySize)...)
		m.sig = append([]byte(nil), r.Take(ed25519.SignatureSize)...)
		m.peer = readPeerInfo(r)
	case kindWelcome:
		m.peer = readPeerInfo(r)
	case kindRefused:
		m.status = transport.Status(r.I32())
		m.text = string(r.Bytes32("message", maxRefusalText))
	case kindResponse:
		m.status = transport.Status(r.I32())
		m.text = string(r.Bytes32("message", maxMessageText))
		m.token = r.U64()
		m.data = r.Bytes32("payload", maxMetadataBytes)
		switch r.U8() {
		case 0:
		case 1:
			m.peer = readPeerInfo(r)
		default:
			r.Fail("bad identity flag")
		}
	case kindIdentity, kindPing, kindPong:
	case kindBorrow:
		m.object = r.ID()
		m.token = r.U64()
	case kindUnborrow:
		m.object = r.ID()
		m.count = r.U64()
	case kindLease:
		m.object = r.ID()
	case kindMetadata:
		m.object = r.ID()
		m.transport = r.Str8("transport", 63)
	case kindSend:
		m.object = r.ID()
		m.transferID = r.U64()
		m.transport = r.Str8("transport", 63)
		m.data = r.Bytes32("communicator metadata", maxMetadataBytes)
	case kindCancel:
		m.target = r.U64()
	case kindGroupJoin:
		m.group.Name = r.Str8("group name", 127)
		m.group.Backend = r.Str8("group backend", 63)
		m.group.WorldSize = int(r.U32())
		m.group.Rank = int(r.U32())
		if r.Err() == nil {
			if err := transport.CheckGroupName(m.group.Name); err != nil {
				r.Fail("%v", err)
			} else if canon, err := CanonicalName(m.group.Backend); err != nil || canon != m.group.Backend {
				r.Fail("group backend %q is not a canonical transport name", m.group.Backend)
			} else if m.group.WorldSize < 1 || m.group.WorldSize > transport.MaxGroupSize || m.group.Rank >= m.group.WorldSize {
				r.Fail("group rank %d of %d is out of range", m.group.Rank, m.group.WorldSize)
			}
		}
	default:
		r.Fail("unknown message kind %d", m.kind)
	}
	if err := r.Done(); err != nil {
		return nil, err
	}
	if ((m.kind >= kindIdentity && m.kind <= kindSend && m.kind != kindUnborrow) || m.kind == kindGroupJoin) && m.id == 0 {
		return nil, transport.Errorf(transport.ErrCorrupt, "control message: %s request without an id", m.kind)
	}
	if m.transport != "" {
		if canon, err := CanonicalName(m.transport); err != nil || canon != m.transport {
			return nil, transport.Errorf(transport.ErrCorrupt, "control message: transport %q is not a canonical name", m.transport)
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
		return nil, transport.Errorf(transport.ErrCorrupt, "control message: frame of %d bytes is outside %d..%d", n, frameHeader-4, limit)
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
