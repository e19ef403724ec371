package transport

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"net"
	"time"

	"golang.org/x/sys/unix"
)

// Host is what a built-in transport may ask of the runtime it belongs to.
type Host interface {
	// Identity describes the runtime (complete once creation returned).
	Identity() PeerInfo
	// Log is the runtime's logger.
	Log() *Logger
	// Context is cancelled when the runtime is being destroyed.
	Context() context.Context
	// PinObject returns the tensors of a live object this runtime owns and
	// keeps the object from being freed until unpin is called. Objects
	// exposed for writing are never served: ErrPermissionDenied.
	PinObject(id ObjectID) (tensors []Tensor, unpin func(), err error)
	// WriteInto lets a transport's server land bytes of a write the owner
	// admitted: writeID names a write open into obj (the writer's
	// Transfer.TransferID). It returns the object's tensors and the pieces
	// the write covers, as MergePieces lists them for Covered (nil: every
	// tensor, whole), and done, which the server calls once it writes no
	// more for this request: until then the object stays pinned and the
	// write's notice waits. A write that is not open (never admitted,
	// ended, its writer gone) is ErrNotFound.
	WriteInto(obj ObjectID, writeID uint64) (tensors []Tensor, pieces []Piece, done func(), err error)
	// AuthToken is the shared secret TCP endpoints require of their peers
	// ("" when none is configured; such endpoints bind loopback only).
	AuthToken() string
	// RuntimeSecret is a random secret made when the runtime is created
	// (32 bytes, hexadecimal). With no token configured, TCP endpoints
	// require it instead, and it reaches peers only inside refs.
	RuntimeSecret() string
	// BindHost is the address TCP listeners bind: the control plane's TCP
	// host when a token is set, else "127.0.0.1".
	BindHost() string
	// AdvertiseHost is the host name or IP peers dial to reach BindHost.
	AdvertiseHost() string
	// SocketDir is a directory only this user can enter, for Unix sockets.
	SocketDir() string
	// PeerTimeout is how long a silent peer counts as alive; a transport
	// serving a peer that makes no progress for as long gives up on it.
	PeerTimeout() time.Duration
	// Settings are the tunables the runtime read from the environment
	// when it was created; transports never read it themselves.
	Settings() Settings
}

// TransportFactory makes a built-in transport for a new runtime. A factory
// returning an ErrUnsupported error (say, a library that is not installed)
// is skipped with a log line.
type TransportFactory struct {
	Name string
	New  func(h Host) (Transport, error)
	// Settings are the environment variables the transport reads (through
	// Host.Settings) or its library loader does; the runtime reads and
	// checks them at creation and lists them in its table.
	Settings []Setting
}

// DefaultPeerTimeout bounds how long a vanished peer goes unnoticed.
const DefaultPeerTimeout = 5 * time.Second

// AuthProof is the response to a challenge: HMAC-SHA256 keyed with the
// shared token over a purpose label and the challenger's nonce. Both ends of
// a TCP endpoint (control plane or data plane) prove the token this way
// without sending it.
func AuthProof(token, purpose string, nonce []byte) []byte {
	m := hmac.New(sha256.New, []byte(token))
	m.Write([]byte(purpose))
	m.Write([]byte{0})
	m.Write(nonce)
	return m.Sum(nil)
}

// CheckAuthProof compares a proof in constant time.
func CheckAuthProof(token, purpose string, nonce, proof []byte) bool {
	return hmac.Equal(AuthProof(token, purpose, nonce), proof)
}

// NewNonce returns 32 random bytes for a challenge.
func NewNonce() []byte {
	a, b := RandomID(), RandomID()
	return append(a[:], b[:]...)
}

// UnixPeerPid is the pid of the process at the other end of a Unix socket,
// as the kernel recorded it at connect (or listen) time (SO_PEERCRED).
func UnixPeerPid(c net.Conn) (int, error) {
	uc, ok := c.(*net.UnixConn)
	if !ok {
		return 0, Errorf(ErrUnsupported, "not a Unix socket")
	}
	raw, err := uc.SyscallConn()
	if err != nil {
		return 0, err
	}
	var cred *unix.Ucred
	var cerr error
	if err := raw.Control(func(fd uintptr) {
		cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return 0, err
	}
	if cerr != nil {
		return 0, cerr
	}
	return int(cred.Pid), nil
}
