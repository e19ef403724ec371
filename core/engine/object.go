package engine

import (
	"maps"
	"slices"
	"sync"

	"github.com/rdt-project/rdt/core/transport"
)

// object is the owner's record of something put.
type object struct {
	desc    *ObjectDesc
	tensors []transport.Tensor
	release func()

	// Guarded by store.mu.
	local       int64                          // ref handles in this runtime
	transit     map[uint64]lease               // lease tokens of serialized refs
	borrows     map[transport.RuntimeID]uint64 // borrows by other runtimes
	borrowTotal uint64
	pins        int64 // sends and serving in progress
	freeing     bool
	collected   chan struct{} // closed once every transport collected it
	freed       chan struct{} // closed once freed (after its release callback)

	write *exposure // objects exposed for writing (exposure.go), else nil

	extractMu sync.Mutex // held while a transport extracts metadata
	metaMu    sync.Mutex
	meta      map[string][]byte // by transport name
}

// holderSet is the objects holding one data pointer: almost always one,
// kept in the map's value without an allocation of its own.
type holderSet struct {
	one  *object
	more map[*object]struct{}
}

// add adds o and reports whether the value must be stored back.
func (h *holderSet) add(o *object) bool {
	switch {
	case h.one == nil && h.more == nil:
		h.one = o
		return true
	case h.one == o:
		return false
	case h.more == nil:
		h.more = map[*object]struct{}{h.one: {}, o: {}}
		h.one = nil
		return true
	default:
		h.more[o] = struct{}{}
		return false
	}
}

// remove removes o and reports whether the set is empty.
func (h *holderSet) remove(o *object) bool {
	if h.more == nil {
		if h.one == o {
			h.one = nil
		}
		return h.one == nil
	}
	delete(h.more, o)
	return len(h.more) == 0
}

// each calls f for every object in the set.
func (h holderSet) each(f func(*object)) {
	if h.one != nil {
		f(h.one)
	}
	for o := range h.more {
		f(o)
	}
}

// metadata returns transport e's metadata for o, extracting it on first
// demand (for objects put without a transport).
func (o *object) metadata(e *registered) ([]byte, error) {
	name := e.desc.Name
	o.metaMu.Lock()
	m, ok := o.meta[name]
	o.metaMu.Unlock()
	if ok {
		return m, nil
	}
	o.extractMu.Lock()
	defer o.extractMu.Unlock()
	o.metaMu.Lock()
	m, ok = o.meta[name]
	freed := o.meta == nil
	o.metaMu.Unlock()
	if ok {
		return m, nil
	}
	if freed {
		return nil, transport.Errorf(transport.ErrNotFound, "object %s was freed", o.desc.ID)
	}
	for i, tn := range o.tensors {
		if !e.desc.Moves(tn.Device.Type) {
			return nil, transport.Errorf(transport.ErrUnsupported, "tensor %d is in %s memory, which transport %s does not move", i, tn.Device.Type, name)
		}
	}
	m, err := extractMetadata(e, o.desc.ID, o.tensors, o.write != nil)
	if err != nil {
		// Asked by a peer, which names the transport it asked for.
		return nil, transport.Wrap(err, "could not extract metadata")
	}
	o.metaMu.Lock()
	o.meta[name] = m
	o.metaMu.Unlock()
	return m, nil
}

// extractMetadata is e's metadata of an object: of one exposed for
// writing where the transport makes that differently (see
// transport.ExposedMetadata).
func extractMetadata(e *registered, id transport.ObjectID, tensors []transport.Tensor, exposed bool) ([]byte, error) {
	if x, ok := e.t.(transport.ExposedMetadata); ok && exposed {
		return x.ExtractExposedMetadata(id, tensors)
	}
	return e.t.ExtractMetadata(id, tensors)
}

// collectMeta calls garbage_collect on each transport of reg that
// extracted metadata for o, in name order.
func (o *object) collectMeta(reg *Registry) {
	o.extractMu.Lock() // let an in-progress extraction finish first
	o.metaMu.Lock()
	meta := o.meta
	o.meta = nil
	o.metaMu.Unlock()
	o.extractMu.Unlock()
	for _, name := range slices.Sorted(maps.Keys(meta)) {
		if e, err := reg.lookup(name); err == nil {
			e.t.GarbageCollect(o.desc.ID, o.tensors, meta[name])
		}
	}
}
