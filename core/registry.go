package core

import (
	"regexp"
	"sort"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/rdt-project/rdt/core/transport"
)

// TransportStats are counters kept per registered transport.
type TransportStats struct {
	TransfersCompleted atomic.Uint64
	TransfersFailed    atomic.Uint64
	BytesReceived      atomic.Uint64
	SendsCompleted     atomic.Uint64
	BytesSent          atomic.Uint64
}

type registered struct {
	t       transport.Transport
	builtin bool
	stats   TransportStats
}

// Registry maps canonical names to transports, per runtime.
type Registry struct {
	mu      sync.RWMutex
	m       map[string]*registered
	adverts []transport.TransportAdvert // rebuilt on every registration
}

func newRegistry() *Registry { return &Registry{m: map[string]*registered{}} }

var nameRE = regexp.MustCompile(`^[A-Za-z0-9_.\-]{1,63}$`)

// CanonicalName validates a transport name and lower-cases it.
func CanonicalName(name string) (string, error) {
	if !nameRE.MatchString(name) {
		return "", transport.Errorf(transport.ErrInvalidArgument, "transport name %q: want 1 to 63 letters, digits, '_', '-' or '.'", name)
	}
	return strings.ToLower(name), nil
}

// Register adds t; a name already present is ErrAlreadyExists.
func (r *Registry) Register(t transport.Transport, builtin bool) error {
	name, err := CanonicalName(t.Name())
	if err != nil {
		return err
	}
	if name != t.Name() {
		return transport.Errorf(transport.ErrInternal, "transport %q must report its canonical name %q", t.Name(), name)
	}
	if len(t.Devices()) == 0 {
		return transport.Errorf(transport.ErrInvalidArgument, "transport %q lists no device types", name)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.m[name]; ok {
		return transport.Errorf(transport.ErrAlreadyExists, "a transport named %q is already registered", name)
	}
	r.m[name] = &registered{t: t, builtin: builtin}
	r.adverts = nil
	for _, n := range sortedNames(r.m) {
		e := r.m[n]
		r.adverts = append(r.adverts, transport.TransportAdvert{Name: n, Devices: e.t.Devices(), OneSided: e.t.OneSided()})
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
		return nil, transport.Errorf(transport.ErrNotFound, "no transport named %q is registered (have: %s)", canon, strings.Join(r.Names(), ", "))
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
func (r *Registry) Adverts() []transport.TransportAdvert {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.adverts
}

// all returns the registered transports, in name order.
func (r *Registry) all() []transport.Transport {
	r.mu.RLock()
	defer r.mu.RUnlock()
	out := make([]transport.Transport, 0, len(r.m))
	for _, n := range sortedNames(r.m) {
		out = append(out, r.m[n].t)
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

func supportsDevice(t transport.Transport, d transport.DeviceType) bool {
	for _, x := range t.Devices() {
		if x == d {
			return true
		}
	}
	return false
}
