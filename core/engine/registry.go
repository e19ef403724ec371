package engine

import (
	"fmt"
	"sort"
	"strings"
	"sync"

	"github.com/rdt-project/rdt/core/transport"
)

type registered struct {
	t       transport.Transport
	desc    transport.Descriptor // read once, at registration
	sender  transport.Sender     // nil for one-sided transports
	writer  transport.Writer     // nil unless the descriptor sets Writes
	builtin bool
	// What this runtime moved over the transport, by direction (see
	// account), and what it sent as the source of two-sided reads.
	moved [2]outcomes
	hist  [2]fetchHistograms
	sends outcomes
}

// Registry maps canonical names to transports, per runtime.
type Registry struct {
	mu      sync.RWMutex
	m       map[string]*registered
	adverts []transport.TransportAdvert // rebuilt on every registration
	// unavailable holds why built-in transports are missing here (their
	// factory reported ErrUnsupported), by name, for error messages.
	unavailable map[string]error
}

func newRegistry() *Registry {
	return &Registry{m: map[string]*registered{}, unavailable: map[string]error{}}
}

// Register adds t, reading its descriptor once; a name already present is
// ErrAlreadyExists.
func (r *Registry) Register(t transport.Transport, builtin bool) error {
	desc := t.Describe()
	desc.Devices = append([]transport.DeviceType(nil), desc.Devices...)
	name, err := transport.CanonicalName(desc.Name)
	if err != nil {
		return err
	}
	if name != desc.Name {
		return transport.Errorf(transport.ErrInternal, "transport %q must report its canonical name %q", desc.Name, name)
	}
	if len(desc.Devices) == 0 {
		return transport.Errorf(transport.ErrInvalidArgument, "transport %q lists no device types", name)
	}
	if desc.Auto.Host < 0 || desc.Auto.CUDA < 0 {
		return transport.Errorf(transport.ErrInternal, "transport %q: automatic ranks are positive, or 0 for none", name)
	}
	sender, _ := t.(transport.Sender)
	if !desc.OneSided && sender == nil {
		return transport.Errorf(transport.ErrInternal, "transport %q is two-sided but has no Send", name)
	}
	if _, ok := t.(transport.GroupBackend); desc.GroupBackend && !ok {
		return transport.Errorf(transport.ErrInternal, "transport %q is described as a group backend but does not form groups", name)
	}
	if desc.OneSided {
		sender = nil
	}
	writer, _ := t.(transport.Writer)
	if desc.Writes && writer == nil {
		return transport.Errorf(transport.ErrInternal, "transport %q is described as writing but has no Write", name)
	}
	if !desc.Writes {
		writer = nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.m[name]; ok {
		return transport.Errorf(transport.ErrAlreadyExists, "a transport named %q is already registered", name)
	}
	r.m[name] = &registered{t: t, desc: desc, sender: sender, writer: writer, builtin: builtin}
	delete(r.unavailable, name)
	r.adverts = nil
	for _, n := range sortedNames(r.m) {
		e := r.m[n]
		r.adverts = append(r.adverts, transport.TransportAdvert{Name: n, Devices: e.desc.Devices, OneSided: e.desc.OneSided})
	}
	return nil
}

// markUnavailable records why a built-in transport is missing.
func (r *Registry) markUnavailable(name string, why error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.m[name]; !ok {
		r.unavailable[name] = why
	}
}

// Unavailable is a built-in transport this runtime could not make, and why.
type Unavailable struct {
	Name   string
	Reason error // its status says what kind of failure (transport.StatusOf)
}

// Unavailable lists the built-in transports missing here, sorted by name.
func (r *Registry) Unavailable() []Unavailable {
	r.mu.RLock()
	defer r.mu.RUnlock()
	out := make([]Unavailable, 0, len(r.unavailable))
	for n, why := range r.unavailable {
		out = append(out, Unavailable{Name: n, Reason: why})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// whyUnavailable explains a missing transport ("" when nothing is known),
// as text to append to a message.
func (r *Registry) whyUnavailable(name string) string {
	r.mu.RLock()
	defer r.mu.RUnlock()
	if why, ok := r.unavailable[name]; ok {
		return "; " + why.Error()
	}
	return ""
}

// whyAllUnavailable explains every missing built-in transport, in name
// order ("" when none is missing).
func (r *Registry) whyAllUnavailable() string {
	r.mu.RLock()
	defer r.mu.RUnlock()
	names := make([]string, 0, len(r.unavailable))
	for n := range r.unavailable {
		names = append(names, n)
	}
	sort.Strings(names)
	var b strings.Builder
	for _, n := range names {
		fmt.Fprintf(&b, "; %s is not available here: %v", n, r.unavailable[n])
	}
	return b.String()
}

// autoOrder lists the registered transports the automatic choice tries for
// data of one kind (cuda: a tensor in CUDA memory, else all host memory),
// best first: by their descriptors' ranks, then by name. Same-host-only
// transports are left out for a peer on another host.
func (r *Registry) autoOrder(cuda, sameHost bool) []string {
	type ranked struct {
		name string
		rank int
	}
	r.mu.RLock()
	var out []ranked
	for name, e := range r.m {
		rank := e.desc.Auto.Host
		if cuda {
			rank = e.desc.Auto.CUDA
		}
		if rank == 0 || (e.desc.SameHostOnly && !sameHost) {
			continue
		}
		out = append(out, ranked{name, rank})
	}
	r.mu.RUnlock()
	sort.Slice(out, func(i, j int) bool {
		if out[i].rank != out[j].rank {
			return out[i].rank < out[j].rank
		}
		return out[i].name < out[j].name
	})
	names := make([]string, len(out))
	for i, x := range out {
		names[i] = x.name
	}
	return names
}

// groupBackend is the name of the registered transport whose descriptor
// makes it the default group backend (the first by name if several do),
// or "" when none does.
func (r *Registry) groupBackend() string {
	r.mu.RLock()
	defer r.mu.RUnlock()
	for _, n := range sortedNames(r.m) {
		if r.m[n].desc.GroupBackend {
			return n
		}
	}
	return ""
}

func sortedNames(m map[string]*registered) []string {
	names := make([]string, 0, len(m))
	for n := range m {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// startBuiltins makes and registers the built-in transports, each with
// host named for it; one that is unsupported here is recorded as
// unavailable and skipped.
func (r *Registry) startBuiltins(factories []transport.TransportFactory, host transportHost) error {
	for _, f := range factories {
		t, err := f.New(host.named(f.Name))
		if err != nil {
			if transport.StatusOf(err) == transport.ErrUnsupported {
				r.markUnavailable(f.Name, err)
				host.log.Debugf("transport %s is not available here: %v", f.Name, err)
				continue
			}
			return transportError(f.Name, err)
		}
		if err := r.Register(t, true); err != nil {
			t.Close()
			return err
		}
	}
	return nil
}

// lookup finds a transport by any-case name.
func (r *Registry) lookup(name string) (*registered, error) {
	canon, err := transport.CanonicalName(name)
	if err != nil {
		return nil, err
	}
	r.mu.RLock()
	e, ok := r.m[canon]
	r.mu.RUnlock()
	if !ok {
		// A built-in transport that could not be made here says why, as
		// rdt doctor does: the library or device it lacks.
		return nil, transport.Errorf(transport.ErrNotFound, "no transport named %q is registered (have: %s)%s", canon, strings.Join(r.Names(), ", "), r.whyUnavailable(canon))
	}
	return e, nil
}

// Get returns the transport registered under name.
func (r *Registry) Get(name string) (transport.Transport, error) {
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
	Devices            []transport.DeviceType
	OneSided, CanAbort bool
	Builtin            bool
	SameHostOnly       bool
	Ranges             bool
	Writes             bool // writes into exposed objects
	Auto               transport.AutoRank
	// Reads this runtime received, writes it sent, and the sends it made
	// as the source of two-sided reads.
	TransfersCompleted uint64
	TransfersFailed    uint64
	BytesReceived      uint64
	WritesCompleted    uint64
	WritesFailed       uint64
	BytesWritten       uint64
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
			Name: name, Devices: e.desc.Devices, OneSided: e.desc.OneSided, CanAbort: e.desc.CanAbort,
			Builtin:            e.builtin,
			SameHostOnly:       e.desc.SameHostOnly,
			Ranges:             e.desc.Ranges,
			Writes:             e.writer != nil,
			Auto:               e.desc.Auto,
			TransfersCompleted: e.moved[transport.Read].completed.Load(),
			TransfersFailed:    e.moved[transport.Read].failed.Load(),
			BytesReceived:      e.moved[transport.Read].bytes.Load(),
			WritesCompleted:    e.moved[transport.Write].completed.Load(),
			WritesFailed:       e.moved[transport.Write].failed.Load(),
			BytesWritten:       e.moved[transport.Write].bytes.Load(),
			SendsCompleted:     e.sends.completed.Load(),
			BytesSent:          e.sends.bytes.Load(),
		})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// Adverts describes the registered transports for peers. The slice is
// shared: do not modify it.
func (r *Registry) Adverts() []transport.TransportAdvert {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.adverts
}

// all returns the registered transports, in name order.
func (r *Registry) all() []*registered {
	r.mu.RLock()
	defer r.mu.RUnlock()
	out := make([]*registered, 0, len(r.m))
	for _, n := range sortedNames(r.m) {
		out = append(out, r.m[n])
	}
	return out
}

// closeAll closes every transport (at runtime destruction).
func (r *Registry) closeAll(log *transport.Logger) {
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

// eagerMaxTensors bounds the objects whose metadata travels in their refs:
// past it, each transport's metadata (some 16 bytes a tensor) is asked of
// the owner once per receiver, and a ref handed around stays small.
const eagerMaxTensors = 4096

// eagerTransports are the transports whose metadata a put without a
// transport extracts at once (see Descriptor.EagerMetadata).
func (r *Registry) eagerTransports(tensors []transport.Tensor) []*registered {
	if len(tensors) > eagerMaxTensors {
		return nil
	}
	r.mu.RLock()
	defer r.mu.RUnlock()
	var out []*registered
	for _, e := range r.m {
		if !e.desc.Eager() {
			continue
		}
		all := true
		for _, t := range tensors {
			all = all && e.desc.Moves(t.Device.Type)
		}
		if all {
			out = append(out, e)
		}
	}
	return out
}

// localCopier is a transport that copies d memory within a process, and
// its name ("" when none is registered).
func (r *Registry) localCopier(d transport.DeviceType) (transport.LocalCopier, string) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	for _, e := range r.m {
		if lc, ok := e.t.(transport.LocalCopier); ok && e.desc.Moves(d) {
			return lc, e.desc.Name
		}
	}
	return nil, ""
}

// checkLocalCopy makes sure a runtime's own object can be copied directly.
func (r *Registry) checkLocalCopy(desc *ObjectDesc, targets []transport.Tensor, pieces []transport.Piece) error {
	for i, tg := range targets {
		t := desc.Tensors[pieceTensor(pieces, i)]
		if t.Device.Type.HostAccessible() && tg.Device.Type.HostAccessible() {
			continue
		}
		if _, name := r.localCopier(deviceSide(t.Device.Type, tg.Device.Type)); name == "" {
			return transport.Errorf(transport.ErrUnsupported, "copying %s memory into %s memory within a process needs a transport that can (none is registered)", t.Device.Type, tg.Device.Type)
		}
	}
	return nil
}

// viewer is the transport named (or, for "", the first registered one
// that maps) and its Viewer.
func (r *Registry) viewer(name string) (*registered, transport.Viewer, error) {
	if name != "" {
		e, err := r.lookup(name)
		if err != nil {
			return nil, nil, err
		}
		vw, ok := e.t.(transport.Viewer)
		if !ok {
			return nil, nil, transport.Errorf(transport.ErrUnsupported, "transport %s cannot map an object (views need one that can, such as shm)", e.desc.Name)
		}
		return e, vw, nil
	}
	r.mu.RLock()
	defer r.mu.RUnlock()
	var best *registered
	for _, e := range r.m {
		if _, ok := e.t.(transport.Viewer); ok && (best == nil || e.desc.Name < best.desc.Name) {
			best = e
		}
	}
	if best == nil {
		return nil, nil, transport.Errorf(transport.ErrUnsupported, "no transport in this runtime can map an object (views need shm)%s", r.whyAllUnavailable())
	}
	return best, best.t.(transport.Viewer), nil
}

// groupBackendFor finds the transport that forms the group: the one the
// spec names, else the registry's default. The spec it returns names it
// canonically.
func (r *Registry) groupBackendFor(spec transport.GroupSpec) (transport.GroupSpec, transport.GroupBackend, error) {
	if spec.Backend == "" {
		spec.Backend = r.groupBackend()
		if spec.Backend == "" {
			return spec, nil, transport.Errorf(transport.ErrUnsupported, "group %q: no transport in this runtime forms groups (have: %s)%s",
				spec.Name, strings.Join(r.Names(), ", "), r.whyAllUnavailable())
		}
	}
	canon, err := transport.CanonicalName(spec.Backend)
	if err != nil {
		return spec, nil, err
	}
	spec.Backend = canon
	t, err := r.Get(canon)
	if err != nil {
		if transport.StatusOf(err) == transport.ErrNotFound {
			return spec, nil, transport.Errorf(transport.ErrUnsupported, "group %q: transport %s is not available in this runtime (have: %s)%s",
				spec.Name, canon, strings.Join(r.Names(), ", "), r.whyUnavailable(canon))
		}
		return spec, nil, err
	}
	backend, ok := t.(transport.GroupBackend)
	if !ok {
		return spec, nil, transport.Errorf(transport.ErrUnsupported, "group %q: transport %s does not form groups", spec.Name, canon)
	}
	return spec, backend, nil
}
