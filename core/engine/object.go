package engine

import (
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
