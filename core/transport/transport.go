package transport

import "time"

// Role says on which side of a transfer a transport call runs.
type Role uint32

const (
	RoleSource      Role = 1
	RoleDestination Role = 2
)

// Direction says which way a transfer's bytes go. Source always sends and
// Destination always receives; the object's owner is Source in a read and
// Destination in a write (see Transfer.Owner).
type Direction uint32

const (
	// Read moves an object's bytes from its owner to a reader.
	Read Direction = 0
	// Write moves a writer's bytes into an object its owner exposed.
	Write Direction = 1
)

func (d Direction) String() string {
	if d == Write {
		return "write"
	}
	return "read"
}

// Verb is what a user calls an operation of the direction, in messages:
// "fetch" or "write".
func (d Direction) Verb() string {
	if d == Write {
		return "write"
	}
	return "fetch"
}

// Transfer describes one transfer of one object to a transport. The same
// TransferID identifies it on both sides.
type Transfer struct {
	Object     ObjectID
	TransferID uint64
	Transport  string
	Role       Role
	Direction  Direction
	// Source sends the bytes and Destination receives them, whatever the
	// direction; Owner says which of them holds the object.
	Source      PeerInfo
	Destination PeerInfo
	// Pieces, in a partial fetch, is what each target receives: Pieces[i]
	// for target i (see PieceOf). Nil: the whole object, target i
	// receiving tensor i. Only transports whose descriptor sets Ranges
	// are given pieces; on the source of a two-sided one, Send gets the
	// destination's pieces and sends those bytes in that order.
	Pieces []Piece
}

// Owner is the runtime that holds the transfer's object: Source in a read,
// Destination in a write.
func (x *Transfer) Owner() PeerInfo {
	if x.Direction == Write {
		return x.Destination
	}
	return x.Source
}

// Transport moves the bytes of objects between runtimes. It mirrors Ray's
// TensorTransportManager: built-in transports (transports/<name>) and
// foreign ones (C vtables registered through the C ABI) both implement it
// and are indistinguishable to the fetch engine.
//
// Every method may be called from several goroutines at once. The core
// never holds one of its locks while calling a transport.
type Transport interface {
	// Describe says what the transport is and can do. The engine calls it
	// once, when the transport is registered, and decides from the answer
	// (see Descriptor).
	Describe() Descriptor

	// ExtractMetadata runs on the source, at put (or on first demand for an
	// object put without a transport), and returns what receivers need.
	ExtractMetadata(obj ObjectID, tensors []Tensor) ([]byte, error)
	// CommunicatorMetadata runs on the destination once per transfer.
	CommunicatorMetadata(x *Transfer) ([]byte, error)
	// Fetch starts receiving into targets on the destination and returns
	// without waiting for the bytes.
	Fetch(x *Transfer, targets []Tensor, tmeta, cmeta []byte) (Request, error)
	// GarbageCollect runs on the source once the object is freed.
	GarbageCollect(obj ObjectID, tensors []Tensor, tmeta []byte)
	// Abort stops a transfer: on the destination req is its request; on the
	// source (a two-sided send) req is nil. The engine calls it only on
	// transports whose descriptor sets CanAbort.
	Abort(x *Transfer, req Request)
	// Close releases the transport when its runtime is destroyed.
	Close() error
}

// Sender is the source's half of a two-sided transport (one whose
// descriptor leaves OneSided false): the engine refuses to register a
// two-sided transport without it, and never asks a one-sided one to send.
type Sender interface {
	// Send runs on the source runtime's goroutine and returns when the
	// tensors are sent.
	Send(x *Transfer, tensors []Tensor, tmeta, cmeta []byte) error
}

// Writer is the writing half of a transport whose descriptor sets Writes.
// A write is a transfer whose Source is the writing runtime (Role
// RoleSource) and whose Destination owns the exposed object; tmeta is the
// metadata the owner extracted for the exposed tensors, and Pieces say where
// each source lands (nil: source i into tensor i, whole). The engine has
// checked the pieces against the object and the owner has admitted the
// write before Write is called.
type Writer interface {
	// Write starts writing sources into the exposed object and returns
	// without waiting for the bytes. When its request finishes every byte
	// is in place, or (after an error or Abort) no byte is written any more.
	Write(x *Transfer, sources []Tensor, tmeta, cmeta []byte) (Request, error)
}

// ExposedMetadata is an optional half of a transport that writes: the
// metadata of an object exposed for writing, where it differs from a put
// object's. shm stages a put object's bytes into shared memory for
// fetches; an exposed object is written in place, so staging it would
// copy it (and hold its size again) for nothing. The engine calls it
// instead of ExtractMetadata for exposed objects, and GarbageCollect with
// its answer as with ExtractMetadata's.
type ExposedMetadata interface {
	ExtractExposedMetadata(obj ObjectID, tensors []Tensor) ([]byte, error)
}

// Preparer is an optional half of a one-sided transport: the checks of a
// fetch or a write (x.Direction says which) done once, for a transfer the engine
// starts again and again with the same tensors and metadata (a prepared
// transfer). Without it, the engine calls Fetch or Write each time.
type Preparer interface {
	Prepare(x *Transfer, local []Tensor, tmeta, cmeta []byte) (Prepared, error)
}

// Prepared starts the transfer it was made for: Start is Fetch (or Write)
// with the prepared tensors and metadata, for x, which differs from the
// prepared Transfer in its TransferID only. Close lets go of what Prepare
// held, once no request of it is running.
type Prepared interface {
	Start(x *Transfer) (Request, error)
	Close()
}

// Viewer is an optional half of a same-host transport of host memory
// (shm): rather than copying an object into targets, it maps the source's
// staged bytes into this process, so that many readers on a host share
// one copy. The mapping must be read-only (private: copy-on-write, writes
// stay in this process), must not change while mapped, whatever the
// source does, and must outlive the source. It ends at the deadline.
type Viewer interface {
	View(x *Transfer, tmeta []byte, private bool, deadline time.Time) (Mapping, error)
}

// Mapping is an object's bytes mapped by a Viewer: Data()[i] is where
// tensor i starts in this process and Sizes()[i] how many bytes of it the
// mapping holds there, as the source's metadata says (each region inside
// the mapping: the Viewer checks it). The engine refuses a ref whose
// tensors disagree with Sizes. Close unmaps them.
type Mapping interface {
	Data() []uintptr
	Sizes() []uint64
	Close() error
}

// Descriptor is everything the engine decides from about a transport. It
// is read once, at registration: a transport whose answers could change
// while it runs says so through EagerWhile, the one question the engine
// asks again.
type Descriptor struct {
	// Name is the canonical (lower-case) name.
	Name string
	// Devices lists the device types the transport moves.
	Devices []DeviceType
	// OneSided transports are driven by the receiver alone; the others
	// implement Sender and the engine runs the source's Send.
	OneSided bool
	// CanAbort transports stop an in-progress transfer when Abort is called.
	CanAbort bool
	// SameHostOnly transports only reach runtimes on their own host (same
	// boot, process and mount namespaces, see PeerInfo.SameHost): the engine
	// refuses them for other peers and leaves them out of the automatic
	// choice there.
	SameHostOnly bool
	// DetectsFreedObjects transports fail a fetch of an object the source
	// has freed rather than returning freed memory (cma reads a guard word
	// the source clears, shm and tcp ask the source runtime). The engine
	// starts those at once on a ref whose borrow the owner has not answered
	// yet; for any other transport it waits for the answer.
	DetectsFreedObjects bool
	// CrossDevice lists the pairs of device types, source then target,
	// that the transport moves directly besides those of Devices into the
	// same type (nixl: host and CUDA memory either way; cuda_ipc: CUDA
	// memory into host memory). The engine stages other host-to-CUDA
	// receives through host memory and refuses the rest.
	CrossDevice []DevicePair
	// Ranges transports serve partial fetches (Transfer.Pieces): any
	// tensors of an object, in any order, each whole or a byte range,
	// moving only those bytes. The engine refuses a partial fetch over any
	// other before anything moves.
	Ranges bool
	// EagerMetadata transports make their metadata cheaply: for objects put
	// without a transport the engine extracts it at put, so that the first
	// fetch needs no extra round trip to the owner.
	EagerMetadata bool
	// EagerWhile, when set, narrows EagerMetadata to the puts at which it
	// returns true (tcp: while its listener runs).
	EagerWhile func() bool
	// Auto places the transport in the automatic choice for objects put
	// without one.
	Auto AutoRank
	// GroupBackend marks the transport that forms groups when a group names
	// no backend (it must implement GroupBackend).
	GroupBackend bool
	// Writes transports write into objects another runtime exposed for
	// writing (they implement Writer); the engine refuses a write over any
	// other before anything moves.
	Writes bool
}

// DevicePair is a source device type and the target device type its bytes
// land in.
type DevicePair struct{ Source, Target DeviceType }

// Lands reports whether the transport moves src memory into dst memory
// directly: both in Devices and the same or both host-accessible, or a
// CrossDevice pair.
func (d *Descriptor) Lands(src, dst DeviceType) bool {
	if src == dst || (src.HostAccessible() && dst.HostAccessible()) {
		return d.Moves(src) && d.Moves(dst) // host memory is all one to a transport
	}
	for _, p := range d.CrossDevice {
		if p.Source == src && p.Target == dst {
			return true
		}
	}
	return false
}

// AutoRank is a transport's place in the automatic choice, per kind of
// data: transports are tried in increasing rank, and 0 leaves the transport
// out for that kind. Host data is an object whose tensors are all in
// host-accessible memory; CUDA data one with a tensor in CUDA device memory.
type AutoRank struct {
	Host int
	CUDA int
}

// Moves reports whether the transport moves memory of device type d.
func (d *Descriptor) Moves(t DeviceType) bool {
	for _, x := range d.Devices {
		if x == t {
			return true
		}
	}
	return false
}

// Eager reports whether the engine extracts the transport's metadata at a
// put without a transport, now.
func (d *Descriptor) Eager() bool {
	return d.EagerMetadata && (d.EagerWhile == nil || d.EagerWhile())
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
// its own goroutine and Wait waits for it (a panic in it is its error).
func RecvFunc(recv func() error) Request {
	r := NewCompletion()
	go func() { r.Finish(Protect(nil, "receiving", recv)) }()
	return r
}

// Completion is a Request that finishes when Finish is called: the request
// of a transport whose fetch runs on a goroutine. Embed it (made by
// NewCompletion) in a request that carries more, and override Release
// where finishing needs cleanup.
type Completion struct {
	done chan struct{}
	err  error
}

// NewCompletion makes a request that is not finished yet.
func NewCompletion() *Completion { return &Completion{done: make(chan struct{})} }

// Finish records the outcome and wakes Wait; call it exactly once.
func (c *Completion) Finish(err error) {
	c.err = err
	close(c.done)
}

// Done is closed once Finish was called.
func (c *Completion) Done() <-chan struct{} { return c.done }

// Wait blocks until Finish was called and returns its error.
func (c *Completion) Wait() error { <-c.done; return c.err }

// Completed reports, without blocking, whether Finish was called.
func (c *Completion) Completed() bool {
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}

// Release frees nothing: a finished completion holds no resource.
func (c *Completion) Release() {}
