package engine

import (
	"github.com/rdt-project/rdt/core/transport"
)

// freedRecordSize bounds how many freed object ids a runtime remembers.
const freedRecordSize = 1024

// freedRecord remembers the ids of the objects a runtime freed most
// recently, so that a request for one of them can say "already freed" while
// an id the runtime never put (or freed long ago) is reported as unknown.
// Remembering every freed id would grow without bound in a long-lived
// process; the oldest ids are forgotten first. Guarded by store.mu.
type freedRecord struct {
	ring []transport.ObjectID // up to freedRecordSize ids; ring[next] is the oldest once full
	next int
	ids  map[transport.ObjectID]struct{}
}

func (r *freedRecord) add(id transport.ObjectID) {
	if r.ids == nil {
		r.ids = map[transport.ObjectID]struct{}{}
	}
	if len(r.ring) < freedRecordSize {
		r.ring = append(r.ring, id)
	} else {
		delete(r.ids, r.ring[r.next])
		r.ring[r.next] = id
		r.next = (r.next + 1) % freedRecordSize
	}
	r.ids[id] = struct{}{}
}

func (r *freedRecord) has(id transport.ObjectID) bool {
	_, ok := r.ids[id]
	return ok
}
