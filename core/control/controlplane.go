package control

import (
	"context"
	"crypto/ed25519"
	"time"

	"github.com/rdt-project/rdt/core/transport"
)

// This file is the seam between the runtime and the control plane: the
// messages runtimes exchange, expressed as Go interfaces. The in-process
// network (inproc.go) calls the peer runtime directly; the socket network
// carries the same calls as framed messages. The runtime neither knows nor
// cares which one it talks through.

// SendRequest asks a source runtime to run a two-sided transport's send.
type SendRequest struct {
	Object     transport.ObjectID
	TransferID uint64
	Transport  string
	CMeta      []byte
	// Pieces are what the destination receives in a partial fetch (nil:
	// every tensor, whole), checked against the object before Send runs.
	Pieces []transport.Piece
}

// GroupJoin is what a rank sends rank 0 to join a group.
type GroupJoin struct {
	Name      string
	Backend   string
	WorldSize int
	Rank      int
}

// PeerService is what a runtime offers to its peers. The network calls it
// on behalf of an authenticated remote runtime, `from`.
type PeerService interface {
	// Identity describes this runtime now (transports may be added later).
	Identity() transport.PeerInfo
	// Borrow registers one borrow of obj by `from`, consuming the
	// serialized ref's lease token if it is still held.
	Borrow(from transport.PeerInfo, obj transport.ObjectID, token uint64) error
	// Unborrow returns n borrows of obj by `from`.
	Unborrow(from transport.RuntimeID, obj transport.ObjectID, n uint64)
	// Lease makes a token that keeps obj alive while a ref serialized by
	// `from` (a borrower) is in transit.
	Lease(from transport.RuntimeID, obj transport.ObjectID) (uint64, error)
	// Metadata returns (extracting on first demand) a transport's metadata
	// for obj.
	Metadata(from transport.RuntimeID, obj transport.ObjectID, transportName string) ([]byte, error)
	// Send runs a two-sided send to `from` and returns when it is done.
	// Cancelling ctx aborts it.
	Send(ctx context.Context, from transport.PeerInfo, req SendRequest) error
	// JoinGroup registers `from` as a rank of a group this runtime is rank 0
	// of, and returns the encoded roster once every rank joined (ErrNotFound
	// while the group is not created here yet). Cancelling ctx withdraws.
	JoinGroup(ctx context.Context, from transport.PeerInfo, req GroupJoin) ([]byte, error)
	// OpenWrite admits a write by `from` into an object this runtime
	// exposed for writing, or refuses it (a wrong key, a revoked object,
	// ranges outside it). A write admitted is open until WriteDone, or
	// until `from` is gone, which tears it. An admitted write gets the
	// object's metadata for req.Transport: an exposed object's metadata
	// (its addresses, a NIXL registration) goes only with the key.
	OpenWrite(from transport.PeerInfo, req WriteOpen) (Admission, error)
	// WriteDone ends a write OpenWrite admitted (or one run of a standing
	// admission): end.Err nil when every byte landed, else why it failed.
	WriteDone(from transport.RuntimeID, end WriteEnd)
	// WriteRun tells the owner that a run of the standing admission
	// transferID begins, with tag: until the run's write done, `from`
	// gone tears the admission with that tag.
	WriteRun(from transport.RuntimeID, obj transport.ObjectID, transferID, tag uint64)
	// WriteWithdrawn tells a writer that the owner `from` withdrew its
	// standing admission end.TransferID (why: err); the writer closes it
	// once no run of it is in progress.
	WriteWithdrawn(from transport.RuntimeID, obj transport.ObjectID, transferID uint64, err error)
	// PeerGone tells the runtime that a peer disconnected or died: its
	// borrows are returned and transports drop what they keep for it.
	PeerGone(peer transport.PeerInfo)
}

// WriteOpen is a writer's request to write into an exposed object.
type WriteOpen struct {
	Object     transport.ObjectID
	TransferID uint64 // the writer's, unique among its writes
	Transport  string
	Key        [16]byte // the writable ref's capability
	Tag        uint64   // the writer's, handed to the owner's notice
	Pieces     []transport.Piece
	// Standing asks for an admission that stays open across runs of a
	// prepared write: each run ends with a WriteEnd carrying its tag and
	// Keep, and the owner withdraws it (WriteWithdrawn) to stop them.
	Standing bool
}

// Admission is an owner's answer to an admitted write.
type Admission struct {
	// Meta is the object's metadata for the write's transport: where an
	// exposed object lies goes only with its key.
	Meta []byte
	// Runs, for a standing admission, is how many runs it covers: each
	// has a notice reserved in the owner's bounded queue. The last one
	// ends without Keep, and the next asks again.
	Runs uint64
}

// WriteEnd is a writer's word that an admitted write, or one run of a
// standing admission, ended.
type WriteEnd struct {
	Object     transport.ObjectID
	TransferID uint64
	// Err is nil when every byte landed. Sent only once no byte of the
	// write can land any more.
	Err error
	// For a standing admission: Tag is the run's, Keep leaves the
	// admission open for the next run, Close ends it without a run (and
	// without a notice).
	Tag   uint64
	Keep  bool
	Close bool
}

// Peer is a connection to another runtime, as seen by the caller.
type Peer interface {
	// Info is the peer's identity as of the handshake or the last Refresh.
	Info() transport.PeerInfo
	// Refresh asks the peer for its identity again.
	Refresh(ctx context.Context) (transport.PeerInfo, error)
	Borrow(ctx context.Context, obj transport.ObjectID, token uint64) error
	// BorrowAsync sends the same request without waiting for the answer and
	// calls done with it (on the connection's goroutine, or at once when the
	// connection is gone or the request could not be sent before ctx
	// ended). Requests on one connection are served in order, so a later
	// Unborrow or fetch request reaches the owner after it.
	BorrowAsync(ctx context.Context, obj transport.ObjectID, token uint64, done func(error))
	// Unborrow is fire-and-forget; a lost peer has dropped our borrows.
	Unborrow(obj transport.ObjectID, n uint64)
	Lease(ctx context.Context, obj transport.ObjectID) (uint64, error)
	Metadata(ctx context.Context, obj transport.ObjectID, transportName string) ([]byte, error)
	// Send asks the peer to send; cancelling ctx aborts the send there.
	Send(ctx context.Context, req SendRequest) error
	// JoinGroup joins a group the peer is rank 0 of; see PeerService.
	JoinGroup(ctx context.Context, req GroupJoin) ([]byte, error)
	// OpenWrite asks the peer to admit a write; see PeerService.
	OpenWrite(ctx context.Context, req WriteOpen) (Admission, error)
	// WriteDone is one-way: it tells the peer a write it admitted ended.
	// Send it only once the bytes are in place or no more can land.
	WriteDone(end WriteEnd)
	// WriteRun is one-way, yet returns only once the announcement is
	// written to the connection (in the socket's buffer, or delivered in
	// process): a run announced so can land bytes, and its owner learns
	// of the run before any loss of this runtime. ctx bounds the wait; an
	// error means the run may have been announced and must end failed,
	// except a ctx already ended with nothing sent.
	WriteRun(ctx context.Context, obj transport.ObjectID, transferID, tag uint64) error
	// WithdrawWrite is one-way: it withdraws a standing admission the
	// peer holds on an object this runtime exposed (see WriteWithdrawn).
	WithdrawWrite(obj transport.ObjectID, transferID uint64, err error)
	// Done is closed when the peer is gone (destroyed, died, disconnected).
	Done() <-chan struct{}
}

// ListenConfig is what a network needs to make a runtime reachable.
type ListenConfig struct {
	Service       PeerService
	Log           *transport.Logger
	SocketDir     string             // private directory for Unix sockets
	ListenTCP     string             // "host:port" for peers on other hosts, or ""
	AuthToken     string             // shared secret TCP peers must prove ("": none configured)
	Secret        string             // this runtime's random secret (see Host.RuntimeSecret)
	Key           ed25519.PrivateKey // identity key: Service.Identity().RuntimeID is derived from it
	AdvertiseHost string             // what peers dial when ListenTCP's host is a wildcard
	PeerTimeout   time.Duration      // silence after which a peer counts as gone
}

// Network is a control-plane implementation.
type Network interface {
	// Listen makes cfg.Service reachable and returns the endpoint.
	Listen(cfg ListenConfig) (Endpoint, error)
}

// Endpoint is a runtime's presence on a network.
type Endpoint interface {
	// Address is what peers connect to; it travels in serialized refs.
	Address() string
	// Connect returns the (cached) connection to the runtime at address:
	// one per pair of runtimes.
	Connect(ctx context.Context, address string) (Peer, error)
	// NumPeers counts live connections.
	NumPeers() int
	// PeersLost counts connections that ended without the peer's closing
	// notice: it died, fell silent past the peer timeout, stopped reading,
	// or broke the protocol. A peer that is alive and well never adds to it.
	PeersLost() uint64
	// Close disconnects every peer (they see Done and PeerGone).
	Close() error
}
