package control

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
// length counts everything after itself and is bounded by MaxFrame, and
// during the handshake by MaxPreAuthFrame. The handshake (hello, challenge,
// auth, welcome, refused) comes first; then requests carry a non-zero id
// that their response repeats, and one-way messages (unborrow, cancel, ping)
// carry id 0. Every field of every body is bounded and validated by
// DecodeMessage.

// Limits a peer's identity and a transport's metadata keep wherever they
// travel: in these messages and in the engine's serialized references.
const (
	// MaxNameLen bounds a runtime's name.
	MaxNameLen = 256
	// MaxAddressLen bounds a runtime's control-plane address.
	MaxAddressLen = 1024
	// MaxHostIDLen bounds a host identity.
	MaxHostIDLen = 1024
	// MaxMetadataBytes bounds one transport's metadata for one object.
	MaxMetadataBytes = 32 << 20
)

const (
	controlMagic   = "RDTC"
	controlVersion = 6
	// MaxFrame bounds every frame after the handshake (length excluded).
	MaxFrame       = MaxMetadataBytes + 1<<20
	frameHeader    = 4 + 1 + 8
	maxMessageText = 64 << 10
	maxRefusalText = 1 << 10
	maxAdverts     = 64
	maxAdvertDevs  = 8

	// maxPeerInfo is the largest encoded PeerInfo DecodeMessage accepts.
	maxPeerInfo = 16 + 2 + MaxNameLen + 2 + MaxAddressLen + 2 + MaxHostIDLen + 4 + 4 +
		maxAdverts*(1+63+1+1+maxAdvertDevs*4)
	// MaxPreAuthFrame bounds every frame of the handshake (length excluded):
	// the largest, auth, holds a proof, a key, a signature and a PeerInfo.
	// Before a peer proved anything, nothing bigger is read.
	MaxPreAuthFrame = frameHeader - 4 + max(
		4+2+NonceSize, // hello
		NonceSize+ProofSize+ed25519.PublicKeySize+ed25519.SignatureSize,   // challenge
		ProofSize+ed25519.PublicKeySize+ed25519.SignatureSize+maxPeerInfo, // auth
		maxPeerInfo,        // welcome
		4+4+maxRefusalText) // refused
)

// Kind says what a message is: a step of the handshake, a request, a
// response or a one-way notice.
type Kind uint8

const (
	KindHello Kind = iota + 1
	KindChallenge
	KindAuth
	KindWelcome
	KindRefused
	KindResponse
	KindIdentity
	KindBorrow
	KindUnborrow
	KindLease
	KindMetadata
	KindSend
	KindCancel
	KindPing
	KindPong
	KindGroupJoin
	// KindClosing is a runtime's notice that it is being destroyed: the
	// receiver closes the connection, which the sender waits for before it
	// frees its objects (see sockEndpoint.Close).
	KindClosing
	// KindWriteOpen asks an exposed object's owner to admit a write;
	// KindWriteDone (one-way) follows the write's bytes with its outcome.
	KindWriteOpen
	KindWriteDone
	// KindWriteWithdrawn (one-way, owner to writer) withdraws a standing
	// admission: the writer closes it once no run of it is in progress.
	KindWriteWithdrawn
	KindEnd // not a kind: the first invalid value
)

var KindNames = [...]string{"", "hello", "challenge", "auth", "welcome", "refused", "response",
	"identity", "borrow", "unborrow", "lease", "metadata", "send", "cancel", "ping", "pong", "group join", "closing", "write open", "write done", "write withdrawn"}

func (k Kind) String() string {
	if k > 0 && k < KindEnd {
		return KindNames[k]
	}
	return "unknown"
}

// Message is one decoded frame; which fields are meaningful depends on
// Kind. It is exported, with its codec, for tests that speak the protocol
// by hand.
type Message struct {
	Kind  Kind
	ID    uint64
	Nonce []byte             // hello, challenge
	Proof []byte             // challenge, auth: the token proof
	Key   []byte             // challenge, auth: the sender's public identity key
	Sig   []byte             // challenge, auth: its signature of the handshake transcript
	Peer  transport.PeerInfo // auth, welcome; identity responses
	// Response and refusal.
	Status transport.Status
	Text   string
	Data   []byte // response payload (metadata)
	Token  uint64 // borrow, lease response
	// Requests.
	Object     transport.ObjectID
	Count      uint64 // unborrow; ping, pong: the bytes of frames the sender has read
	Transport  string
	TransferID uint64
	Target     uint64 // cancel: the request id to cancel
	Group      GroupJoin
	Pieces     []transport.Piece // send: a partial fetch's; write open: where the write lands (nil: whole)
	WriteKey   [16]byte          // write open: the writable ref's capability
	Flags      uint8             // write open: WriteStanding; write done: WriteKeep, WriteClose
}

// Flags of the write messages.
const (
	// WriteStanding (write open) asks for a standing admission: open
	// across runs, each run ended by a write done with its own tag.
	WriteStanding uint8 = 1 << 0
	// WriteKeep (write done) ends one run of a standing admission and
	// keeps the admission open for the next.
	WriteKeep uint8 = 1 << 1
	// WriteClose (write done) closes a standing admission without a run:
	// no notice.
	WriteClose uint8 = 1 << 2
)

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
		p.Transports = append(p.Transports, a)
	}
	if r.Err() == nil && p.RuntimeID.IsZero() {
		r.Fail("zero runtime id")
	}
	return p
}

// Encode makes the frame for m, length prefix included.
func (m *Message) Encode() []byte {
	w := transport.NewWireWriter(make([]byte, frameHeader, 64+len(m.Data)))
	switch m.Kind {
	case KindHello:
		w.Raw([]byte(controlMagic))
		w.U16(controlVersion)
		w.Raw(m.Nonce)
	case KindChallenge:
		w.Raw(m.Nonce)
		w.Raw(m.Proof)
		w.Raw(m.Key)
		w.Raw(m.Sig)
	case KindAuth:
		w.Raw(m.Proof)
		w.Raw(m.Key)
		w.Raw(m.Sig)
		writePeerInfo(w, m.Peer)
	case KindWelcome:
		writePeerInfo(w, m.Peer)
	case KindRefused:
		w.I32(int32(m.Status))
		text := m.Text
		if len(text) > maxRefusalText {
			text = text[:maxRefusalText]
		}
		w.Bytes32([]byte(text))
	case KindResponse:
		w.I32(int32(m.Status))
		w.Bytes32([]byte(m.Text))
		w.U64(m.Token)
		w.Bytes32(m.Data)
		if m.Peer.RuntimeID.IsZero() {
			w.U8(0)
		} else {
			w.U8(1)
			writePeerInfo(w, m.Peer)
		}
	case KindIdentity, KindClosing:
	case KindPing, KindPong:
		w.U64(m.Count)
	case KindBorrow:
		w.Raw(m.Object[:])
		w.U64(m.Token)
	case KindUnborrow:
		w.Raw(m.Object[:])
		w.U64(m.Count)
	case KindLease:
		w.Raw(m.Object[:])
	case KindMetadata:
		w.Raw(m.Object[:])
		w.Str8(m.Transport)
	case KindSend:
		w.Raw(m.Object[:])
		w.U64(m.TransferID)
		w.Str8(m.Transport)
		w.Bytes32(m.Data)
		if m.Pieces != nil {
			// A trailing section, absent from a whole fetch's request, so
			// that those read the same in every version.
			w.U32(uint32(len(m.Pieces)))
			for _, p := range m.Pieces {
				w.U32(p.Tensor)
				w.U64(p.Offset)
				w.U64(p.Length)
			}
		}
	case KindWriteOpen:
		w.Raw(m.Object[:])
		w.U64(m.TransferID)
		w.Str8(m.Transport)
		w.Raw(m.WriteKey[:])
		w.U64(m.Token)
		w.U8(m.Flags)
		writePieces(w, m.Pieces)
	case KindWriteDone:
		w.Raw(m.Object[:])
		w.U64(m.TransferID)
		w.I32(int32(m.Status))
		w.Bytes32([]byte(m.Text))
		w.U64(m.Token)
		w.U8(m.Flags)
	case KindWriteWithdrawn:
		w.Raw(m.Object[:])
		w.U64(m.TransferID)
		w.I32(int32(m.Status))
		w.Bytes32([]byte(m.Text))
	case KindCancel:
		w.U64(m.Target)
	case KindGroupJoin:
		w.Str8(m.Group.Name)
		w.Str8(m.Group.Backend)
		w.U32(uint32(m.Group.WorldSize))
		w.U32(uint32(m.Group.Rank))
	}
	b := w.Bytes()
	binary.LittleEndian.PutUint32(b[0:4], uint32(len(b)-4))
	b[4] = byte(m.Kind)
	binary.LittleEndian.PutUint64(b[5:13], m.ID)
	return b
}

// writePieces writes a trailing section of pieces, absent when there are
// none (a whole object), so that whole requests read the same in every
// version.
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

// Sizes of a handshake's nonce and of a token proof.
const (
	NonceSize = 32
	ProofSize = 32
)

// DecodeMessage parses one frame body (everything after the length).
func DecodeMessage(b []byte) (*Message, error) {
	r := transport.NewWireReader("control message", b)
	m := &Message{Kind: Kind(r.U8()), ID: r.U64()}
	if r.Err() != nil {
		return nil, r.Err()
	}
	switch m.Kind {
	case KindHello:
		if string(r.Take(4)) != controlMagic && r.Err() == nil {
			r.Fail("bad magic: not an rdt peer")
		}
		if v := r.U16(); r.Err() == nil && v != controlVersion {
			r.Fail("protocol version %d is not supported (this runtime speaks %d)", v, controlVersion)
		}
		m.Nonce = append([]byte(nil), r.Take(NonceSize)...)
	case KindChallenge:
		m.Nonce = append([]byte(nil), r.Take(NonceSize)...)
		m.Proof = append([]byte(nil), r.Take(ProofSize)...)
		m.Key = append([]byte(nil), r.Take(ed25519.PublicKeySize)...)
		m.Sig = append([]byte(nil), r.Take(ed25519.SignatureSize)...)
	case KindAuth:
		m.Proof = append([]byte(nil), r.Take(ProofSize)...)
		m.Key = append([]byte(nil), r.Take(ed25519.PublicKeySize)...)
		m.Sig = append([]byte(nil), r.Take(ed25519.SignatureSize)...)
		m.Peer = readPeerInfo(r)
	case KindWelcome:
		m.Peer = readPeerInfo(r)
	case KindRefused:
		m.Status = transport.Status(r.I32())
		m.Text = string(r.Bytes32("message", maxRefusalText))
	case KindResponse:
		m.Status = transport.Status(r.I32())
		m.Text = string(r.Bytes32("message", maxMessageText))
		m.Token = r.U64()
		m.Data = r.Bytes32("payload", MaxMetadataBytes)
		switch r.U8() {
		case 0:
		case 1:
			m.Peer = readPeerInfo(r)
		default:
			r.Fail("bad identity flag")
		}
	case KindIdentity, KindClosing:
	case KindPing, KindPong:
		m.Count = r.U64()
	case KindBorrow:
		m.Object = r.ID()
		m.Token = r.U64()
	case KindUnborrow:
		m.Object = r.ID()
		m.Count = r.U64()
	case KindLease:
		m.Object = r.ID()
	case KindMetadata:
		m.Object = r.ID()
		m.Transport = r.Str8("transport", 63)
	case KindSend:
		m.Object = r.ID()
		m.TransferID = r.U64()
		m.Transport = r.Str8("transport", 63)
		m.Data = r.Bytes32("communicator metadata", MaxMetadataBytes)
		m.Pieces = readPieces(r)
	case KindWriteOpen:
		m.Object = r.ID()
		m.TransferID = r.U64()
		m.Transport = r.Str8("transport", 63)
		copy(m.WriteKey[:], r.Take(len(m.WriteKey)))
		m.Token = r.U64()
		m.Flags = r.U8()
		if m.Flags&^WriteStanding != 0 && r.Err() == nil {
			r.Fail("bad write open flags %#x", m.Flags)
		}
		m.Pieces = readPieces(r)
	case KindWriteDone:
		m.Object = r.ID()
		m.TransferID = r.U64()
		m.Status = transport.Status(r.I32())
		m.Text = string(r.Bytes32("message", maxMessageText))
		m.Token = r.U64()
		m.Flags = r.U8()
		if (m.Flags&^(WriteKeep|WriteClose) != 0 || m.Flags == WriteKeep|WriteClose) && r.Err() == nil {
			r.Fail("bad write done flags %#x", m.Flags)
		}
	case KindWriteWithdrawn:
		m.Object = r.ID()
		m.TransferID = r.U64()
		m.Status = transport.Status(r.I32())
		m.Text = string(r.Bytes32("message", maxMessageText))
	case KindCancel:
		m.Target = r.U64()
	case KindGroupJoin:
		m.Group.Name = r.Str8("group name", 127)
		m.Group.Backend = r.Str8("group backend", 63)
		m.Group.WorldSize = int(r.U32())
		m.Group.Rank = int(r.U32())
		if r.Err() == nil {
			if err := transport.CheckGroupName(m.Group.Name); err != nil {
				r.Fail("%v", err)
			} else if canon, err := transport.CanonicalName(m.Group.Backend); err != nil || canon != m.Group.Backend {
				r.Fail("group backend %q is not a canonical transport name", m.Group.Backend)
			} else if m.Group.WorldSize < 1 || m.Group.WorldSize > transport.MaxGroupSize || m.Group.Rank >= m.Group.WorldSize {
				r.Fail("group rank %d of %d is out of range", m.Group.Rank, m.Group.WorldSize)
			}
		}
	default:
		r.Fail("unknown Message kind %d", m.Kind)
	}
	if err := r.Done(); err != nil {
		return nil, err
	}
	if ((m.Kind >= KindIdentity && m.Kind <= KindSend && m.Kind != KindUnborrow) || m.Kind == KindGroupJoin || m.Kind == KindWriteOpen) && m.ID == 0 {
		return nil, transport.Errorf(transport.ErrCorrupt, "control Message: %s request without an id", m.Kind)
	}
	if m.Transport != "" {
		if canon, err := transport.CanonicalName(m.Transport); err != nil || canon != m.Transport {
			return nil, transport.Errorf(transport.ErrCorrupt, "control Message: transport %q is not a canonical name", m.Transport)
		}
	}
	return m, nil
}

// frameChunk is how much of a frame body is read before its buffer grows.
const frameChunk = 64 << 10

// ReadFrame reads one length-prefixed frame body of at most limit bytes
// into buf. A buffer too small grows as the bytes arrive, doubling, so a
// length prefix alone never costs more than frameChunk: memory follows what
// the peer actually sent.
func ReadFrame(rd io.Reader, buf []byte, limit uint32) ([]byte, error) {
	var hdr [4]byte
	if _, err := io.ReadFull(rd, hdr[:]); err != nil {
		return nil, err
	}
	n := binary.LittleEndian.Uint32(hdr[:])
	if n < frameHeader-4 || n > limit {
		return nil, transport.Errorf(transport.ErrCorrupt, "control Message: frame of %d bytes is outside %d..%d", n, frameHeader-4, limit)
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
