package transport

// Role says on which side of a transfer a transport call runs.
type Role uint32

const (
	RoleSource      Role = 1
	RoleDestination Role = 2
)

// Transfer describes one transfer of one object to a transport. The same
// TransferID identifies it on both sides.
type Transfer struct {
	Object      ObjectID
	TransferID  uint64
	Transport   string
	Role        Role
	Source      PeerInfo
	Destination PeerInfo
}

// Transport moves the bytes of objects between runtimes. It mirrors Ray's
// TensorTransportManager: built-in transports (transports/<name>) and
// foreign ones (C vtables registered through the C ABI) both implement it
// and are indistinguishable to the fetch engine.
//
// Every method may be called from several goroutines at once. The core
// never holds one of its locks while calling a transport.
type Transport interface {
	// Name is the canonical (lower-case) name.
	Name() string
	// Devices lists the device types the transport moves.
	Devices() []DeviceType
	// OneSided transports are driven by the receiver alone; the core never
	// calls Send on them.
	OneSided() bool
	// CanAbort transports stop an in-progress transfer when Abort is called.
	CanAbort() bool

	// ExtractMetadata runs on the source, at put (or on first demand for an
	// object put without a transport), and returns what receivers need.
	ExtractMetadata(obj ObjectID, tensors []Tensor) ([]byte, error)
	// CommunicatorMetadata runs on the destination once per transfer.
	CommunicatorMetadata(x *Transfer) ([]byte, error)
	// Send runs on the source of a two-sided transport, on the source
	// runtime's goroutine, and returns when the tensors are sent.
	Send(x *Transfer, tensors []Tensor, tmeta, cmeta []byte) error
	// Fetch starts receiving into targets on the destination and returns
	// without waiting for the bytes.
	Fetch(x *Transfer, targets []Tensor, tmeta, cmeta []byte) (Request, error)
	// GarbageCollect runs on the source once the object is freed.
	GarbageCollect(obj ObjectID, tensors []Tensor, tmeta []byte)
	// Abort stops a transfer: on the destination req is its request; on the
	// source (a two-sided send) req is nil.
	Abort(x *Transfer, req Request)
	// Close releases the transport when its runtime is destroyed.
	Close() error
}

// Request is an in-progress fetch.
type Request interface {
	// Wait blocks until the transfer completed, failed or was aborted.
	Wait() error
	// Release frees the request. The engine calls it exactly once, after
	// Wait returned.
	Release()
}

// CompletedRequest is implemented by requests that can tell without
// blocking whether they have finished (say, a small copy done inside
// Fetch). The engine finishes those on the caller's goroutine: a goroutine
// hand-off costs more than a small transfer.
type CompletedRequest interface {
	Completed() bool
}

// PeerChecker is implemented by transports that only reach some peers (for
// example same-host transports). The engine asks before using the transport
// and the error explains why not.
type PeerChecker interface {
	CheckPeer(local, peer PeerInfo) error
}

// FreedObjectChecker is implemented by transports whose fetch of an object
// the source has freed fails rather than returning freed memory (cma reads a
// guard word the source clears, shm and tcp ask the source runtime). The
// engine starts those at once on a ref whose borrow the owner has not
// answered yet; for any other transport it waits for the answer.
type FreedObjectChecker interface {
	ChecksFreedObjects() bool
}

// PeerWatcher is implemented by transports that keep state per peer
// runtime (process descriptors, pooled connections, mappings). The core
// calls PeerGone once the last control connection to that peer closed
// (it exited, died or was destroyed), never holding one of its locks.
type PeerWatcher interface {
	PeerGone(peer PeerInfo)
}

// LocalCopier is implemented by transports that can copy tensors of their
// device types within one process (a device-to-device copy). The engine uses
// it to fetch a runtime's own objects when the memory is not host-accessible.
type LocalCopier interface {
	CopyLocal(dst, src []Tensor) error
}

// RecvFunc adapts a synchronous receive into a Request: the function runs on
// its own goroutine and Wait waits for it.
func RecvFunc(recv func() error) Request {
	r := &funcRequest{done: make(chan struct{})}
	go func() {
		r.err = recv()
		close(r.done)
	}()
	return r
}

type funcRequest struct {
	done chan struct{}
	err  error
}

func (r *funcRequest) Wait() error { <-r.done; return r.err }
func (r *funcRequest) Completed() bool {
	select {
	case <-r.done:
		return true
	default:
		return false
	}
}
func (r *funcRequest) Release() {}
