package core

import (
	"regexp"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
)

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

// TransportStats are counters kept per registered transport.
type TransportStats struct {
	TransfersCompleted atomic.Uint64
	TransfersFailed    atomic.Uint64
	BytesReceived      atomic.Uint64
	SendsCompleted     atomic.Uint64
	BytesSent          atomic.Uint64
}

type registered struct {
	t       Transport
	builtin bool
	stats   TransportStats
}

// Registry maps canonical names to transports, per runtime.
type Registry struct {
	mu      sync.RWMutex
	m       map[string]*registered
	adverts []TransportAdvert // rebuilt on every registration
}

func newRegistry() *Registry { return &Registry{m: map[string]*registered{}} }

var nameRE = regexp.MustCompile(`^[A-Za-z0-9_.\-]{1,63}$`)

// CanonicalName validates a transport name and lower-cases it.
func CanonicalName(name string) (string, error) {
	if !nameRE.MatchString(name) {
		return "", Errorf(ErrInvalidArgument, "transport name %q: want 1 to 63 letters, digits, '_', '-' or '.'", name)
	}
	return strings.ToLower(name), nil
}

// Register adds t; a name already present is ErrAlreadyExists.
func (r *Registry) Register(t Transport, builtin bool) error {
	name, err := CanonicalName(t.Name())
	if err != nil {
		return err
	}
	if name != t.Name() {
		return Errorf(ErrInternal, "transport %q must report its canonical name %q", t.Name(), name)
	}
	if len(t.Devices()) == 0 {
		return Errorf(ErrInvalidArgument, "transport %q lists no device types", name)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.m[name]; ok {
		return Errorf(ErrAlreadyExists, "a transport named %q is already registered", name)
	}
	r.m[name] = &registered{t: t, builtin: builtin}
	r.adverts = nil
	for _, n := range sortedNames(r.m) {
		e := r.m[n]
		r.adverts = append(r.adverts, TransportAdvert{Name: n, Devices: e.t.Devices(), OneSided: e.t.OneSided()})
	}
	return nil
}

func sortedNames(m map[string]*registered) []string {
	names := make([]string, 0, len(m))
	for n := range m {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// lookup finds a transport by any-case name.
func (r *Registry) lookup(name string) (*registered, error) {
	canon, err := CanonicalName(name)
	if err != nil {
		return nil, err
	}
	r.mu.RLock()
	e, ok := r.m[canon]
	r.mu.RUnlock()
	if !ok {
		return nil, Errorf(ErrNotFound, "no transport named %q is registered (have: %s)", canon, strings.Join(r.Names(), ", "))
	}
	return e, nil
}

// Get returns the transport registered under name.
func (r *Registry) Get(name string) (Transport, error) {
	e, err := r.lookup(name)
	if err != nil {
		return nil, err
	}
	return e.t, nil
}

// Names lists the registered names, sorted.
func (r *Registry) Names() []string {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return sortedNames(r.m)
}

// TransportInfo is a snapshot of one registered transport.
type TransportInfo struct {
	Name               string
	Devices            []DeviceType
	OneSided, CanAbort bool
	Builtin            bool
	TransfersCompleted uint64
	TransfersFailed    uint64
	BytesReceived      uint64
	SendsCompleted     uint64
	BytesSent          uint64
}

// List snapshots every registered transport, sorted by name.
func (r *Registry) List() []TransportInfo {
	r.mu.RLock()
	defer r.mu.RUnlock()
	out := make([]TransportInfo, 0, len(r.m))
	for name, e := range r.m {
		out = append(out, TransportInfo{
			Name: name, Devices: e.t.Devices(), OneSided: e.t.OneSided(), CanAbort: e.t.CanAbort(),
			Builtin:            e.builtin,
			TransfersCompleted: e.stats.TransfersCompleted.Load(),
			TransfersFailed:    e.stats.TransfersFailed.Load(),
			BytesReceived:      e.stats.BytesReceived.Load(),
			SendsCompleted:     e.stats.SendsCompleted.Load(),
			BytesSent:          e.stats.BytesSent.Load(),
		})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// Adverts describes the registered transports for peers. The slice is
// shared: do not modify it.
func (r *Registry) Adverts() []TransportAdvert {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.adverts
}

// all returns the registered transports, in name order.
func (r *Registry) all() []Transport {
	r.mu.RLock()
	defer r.mu.RUnlock()
	out := make([]Transport, 0, len(r.m))
	for _, n := range sortedNames(r.m) {
		out = append(out, r.m[n].t)
	}
	return out
}

// closeAll closes every transport (at runtime destruction).
func (r *Registry) closeAll(log *Logger) {
	r.mu.Lock()
	entries := r.m
	r.m = map[string]*registered{}
	r.adverts = nil
	r.mu.Unlock()
	for name, e := range entries {
		if err := e.t.Close(); err != nil {
			log.Warnf("closing transport %s: %v", name, err)
		}
	}
}

func supportsDevice(t Transport, d DeviceType) bool {
	for _, x := range t.Devices() {
		if x == d {
			return true
		}
	}
	return false
}
