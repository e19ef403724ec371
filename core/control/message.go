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
// carry id 0.
//
// Each kind's body has a codec of its own in codec.go, an encode and a
// decode function. Encode and DecodeMessage find it in the table codecs,
// indexed by Kind, and add the header and the checks every kind shares.
// A new kind is a constant, a name in KindNames and an entry in
// codecs; the tests fail while one is missing and pin every kind's bytes
// (testdata/messages.golden). Every field of every body is bounded and
// validated by its decode function, every length and count before the
// memory it asks for is allocated.

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
	controlVersion = 7
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
	// KindWriteRun (one-way) announces a run of a standing admission, with
	// its tag, before any byte of the run can land: a writer gone mid-run
	// is torn with that tag, one gone between runs wrote nothing unnoticed.
	KindWriteRun
	KindEnd // not a kind: the first invalid value
)

// KindNames names each kind, indexed by Kind.
var KindNames = [KindEnd]string{"", "hello", "challenge", "auth", "welcome", "refused", "response",
	"identity", "borrow", "unborrow", "lease", "metadata", "send", "cancel", "ping", "pong", "group join", "closing", "write open", "write done", "write withdrawn", "write run"}

func (k Kind) String() string {
	if k > 0 && k < KindEnd {
		return KindNames[k]
	}
	return "unknown"
}

// Message is one decoded frame; which fields are meaningful depends on
// Kind (each kind's codec in codec.go lists its body's). It is exported, with its codec, for tests that speak the protocol
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

// Encode makes the frame for m, length prefix included: the header, then
// the body as m.Kind's codec writes it (none for a kind without one).
func (m *Message) Encode() []byte {
	w := transport.NewWireWriter(make([]byte, frameHeader, 64+len(m.Data)))
	if c := codecOf(m.Kind); c != nil {
		c.encode(w, m)
	}
	b := w.Bytes()
	binary.LittleEndian.PutUint32(b[0:4], uint32(len(b)-4))
	b[4] = byte(m.Kind)
	binary.LittleEndian.PutUint64(b[5:13], m.ID)
	return b
}

// Sizes of a handshake's nonce and of a token proof.
const (
	NonceSize = 32
	ProofSize = 32
)

// DecodeMessage parses one frame body (everything after the length): the
// header, the body by its kind's codec, then what every kind shares: no
// byte left over, a request's id, a transport's canonical name.
func DecodeMessage(b []byte) (*Message, error) {
	r := transport.NewWireReader("control message", b)
	m := &Message{Kind: Kind(r.U8()), ID: r.U64()}
	if r.Err() != nil {
		return nil, r.Err()
	}
	c := codecOf(m.Kind)
	if c == nil {
		r.Fail("unknown Message kind %d", m.Kind)
		return nil, r.Err()
	}
	c.decode(r, m)
	if err := r.Done(); err != nil {
		return nil, err
	}
	if c.request && m.ID == 0 {
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
