package engine

import (
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/rdt-project/rdt/core/transport"
)

// store is a runtime's object store: the objects it owns (with their
// index by data pointer, leases, the borrows peers hold, pins and the
// record of freed ids), the entries of other runtimes' objects it
// borrows, and its fetches in flight. One mutex guards all of it and only
// the store's methods take it: callers never hold it, and methods named
// ...Locked are the store's own steps, called with it held. Its objects
// are in object.go, what it lends (leases, peers' borrows) in lending.go,
// what it borrows in borrowing.go.
type store struct {
	name  string // the runtime's, for errors
	log   *transport.Logger
	lease time.Duration // how long a serialized ref keeps its object alive
	c     *counters
	// reg is the runtime's transports, which collect a freed object's
	// metadata (finalize).
	reg *Registry
	// bg counts the goroutines finalizing objects (freeLater), which the
	// runtime's destroy waits for.
	bg *sync.WaitGroup

	mu       sync.Mutex
	closed   bool
	objects  map[transport.ObjectID]*object
	exposed  map[*object]struct{} // the objects of objects exposed for writing
	byData   map[uintptr]holderSet
	borrowed map[transport.ObjectID]*borrowEntry
	fetches  map[*Fetch]struct{}
	// leases granted to each peer and not yet consumed or expired, for
	// MaxLeasesPerPeer, and to all of them, for MaxPeerLeases
	peerLeases     map[transport.RuntimeID]int
	peerLeasesHeld int
	freed          freedRecord // ids of recently freed objects, for error messages
}

func newStore(name string, log *transport.Logger, leaseFor time.Duration, c *counters, reg *Registry, bg *sync.WaitGroup) *store {
	return &store{
		name: name, log: log, lease: leaseFor, c: c, reg: reg, bg: bg,
		objects:    map[transport.ObjectID]*object{},
		exposed:    map[*object]struct{}{},
		byData:     map[uintptr]holderSet{},
		borrowed:   map[transport.ObjectID]*borrowEntry{},
		fetches:    map[*Fetch]struct{}{},
		peerLeases: map[transport.RuntimeID]int{},
	}
}

func (s *store) errClosed() error {
	return transport.Errorf(transport.ErrClosed, "runtime %s was destroyed", s.name)
}

func (s *store) checkOpen() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return s.errClosed()
	}
	return nil
}

// ---- the runtime's life ----

// close marks the store closed and hands back the fetches in flight and
// the borrow entries, which Destroy aborts and returns. It reports false
// when the store was closed already.
func (s *store) close() (fetches []*Fetch, borrowed map[transport.ObjectID]*borrowEntry, first bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, nil, false
	}
	s.closed = true
	fetches = make([]*Fetch, 0, len(s.fetches))
	for f := range s.fetches {
		fetches = append(fetches, f)
	}
	borrowed = s.borrowed
	s.borrowed = map[transport.ObjectID]*borrowEntry{}
	return fetches, borrowed, true
}

// pinned counts the objects a send or a server still reads.
func (s *store) pinned() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, o := range s.objects {
		if o.pins > 0 {
			n++
		}
	}
	return n
}

// waitUnpinned waits until no send or server reads an object's memory.
func (s *store) waitUnpinned() {
	start := time.Now()
	warned := false
	for {
		pinned := s.pinned()
		if pinned == 0 {
			return
		}
		if !warned && time.Since(start) > 5*time.Second {
			s.log.Warnf("destroy is waiting for %d objects still being sent by transports that cannot abort", pinned)
			warned = true
		}
		time.Sleep(time.Millisecond)
	}
}

// drain takes every object out of a closed store, its leases stopped, for
// Destroy to finalize.
func (s *store) drain() []*object {
	s.mu.Lock()
	defer s.mu.Unlock()
	objs := make([]*object, 0, len(s.objects))
	for _, o := range s.objects {
		for _, l := range o.transit {
			l.timer.Stop()
		}
		o.freeing = true
		objs = append(objs, o)
	}
	s.objects = map[transport.ObjectID]*object{}
	s.exposed = map[*object]struct{}{}
	return objs
}

// exposedObjects are the live objects exposed for writing.
func (s *store) exposedObjects() []*object {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]*object, 0, len(s.exposed))
	for o := range s.exposed {
		out = append(out, o)
	}
	return out
}

// ---- owned objects ----

// add stores a new object and indexes its tensors' data.
func (s *store) add(o *object) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return s.errClosed()
	}
	s.objects[o.desc.ID] = o
	if o.write != nil {
		s.exposed[o] = struct{}{}
	}
	for _, t := range o.tensors {
		set := s.byData[t.Orig]
		if set.add(o) {
			s.byData[t.Orig] = set
		}
	}
	return nil
}

// forgetData drops a finalized object from the index by data pointer.
func (s *store) forgetData(o *object) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, t := range o.tensors {
		set, ok := s.byData[t.Orig]
		if !ok {
			continue
		}
		if set.remove(o) {
			delete(s.byData, t.Orig)
		} else {
			s.byData[t.Orig] = set
		}
	}
}

// maybeFreeLocked frees o once nothing references it.
func (s *store) maybeFreeLocked(o *object) {
	if o.freeing || o.local > 0 || len(o.transit) > 0 || o.borrowTotal > 0 || o.pins > 0 {
		return
	}
	o.freeing = true
	delete(s.objects, o.desc.ID)
	delete(s.exposed, o)
	s.freed.add(o.desc.ID)
	s.freeLater(o)
}

// freeLater finalizes o, which nothing references any more, on a goroutine
// Destroy waits for. The store calls it with its lock held.
func (s *store) freeLater(o *object) {
	s.bg.Add(1)
	go func() {
		defer s.bg.Done()
		s.finalize(o)
	}()
}

// finalize runs garbage_collect on every transport that extracted metadata,
// then the release callback, then wakes wait_tensor_freed.
func (s *store) finalize(o *object) {
	o.collectMeta(s.reg)
	close(o.collected)
	if o.release != nil {
		o.release()
	}
	s.forgetData(o)
	if o.write != nil {
		o.write.close()
	}
	s.c.objectsFreed.Add(1)
	close(o.freed)
	s.log.Debugf("freed object %s", o.desc.ID)
}

// liveObjectLocked finds an object this runtime owns that is not being
// freed.
func (s *store) liveObjectLocked(id transport.ObjectID) (*object, error) {
	if s.closed {
		return nil, transport.Errorf(transport.ErrPeerUnavailable, "runtime %s is shutting down", s.name)
	}
	o, ok := s.objects[id]
	switch {
	case ok && !o.freeing:
		return o, nil
	case ok || s.freed.has(id):
		return nil, transport.Errorf(transport.ErrNotFound, "object %s was already freed by its owner %s", id, s.name)
	default:
		return nil, transport.Errorf(transport.ErrNotFound, "object %s is unknown to its owner %s: it was never put there, or was freed long ago", id, s.name)
	}
}

// owned is the record of an object this runtime owns, while a handle
// holds it.
func (s *store) owned(id transport.ObjectID) (*object, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, s.errClosed()
	}
	o, ok := s.objects[id]
	if !ok {
		return nil, transport.Errorf(transport.ErrInternal, "owned object %s is missing while a ref is held", id)
	}
	return o, nil
}

// pin keeps a live object's memory from being freed until unpin: a send
// or a server reads it.
func (s *store) pin(id transport.ObjectID) (*object, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	o, err := s.liveObjectLocked(id)
	if err != nil {
		return nil, err
	}
	o.pins++
	return o, nil
}

func (s *store) unpin(o *object) {
	s.mu.Lock()
	defer s.mu.Unlock()
	o.pins--
	if !s.closed {
		s.maybeFreeLocked(o)
	}
}

// holders are the objects whose tensors hold data.
func (s *store) holders(data uintptr) []*object {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []*object
	s.byData[data].each(func(o *object) { out = append(out, o) })
	return out
}

// stillHeld says which of holders still hold data, and why.
func (s *store) stillHeld(data uintptr, holders []*object) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	var parts []string
	for _, o := range holders {
		select {
		case <-o.freed:
			continue
		default:
		}
		parts = append(parts, fmt.Sprintf("object %s (%d local refs, %d borrows, %d refs in transit)", o.desc.ID, o.local, o.borrowTotal, len(o.transit)))
	}
	return transport.Errorf(transport.ErrTimeout, "tensor at %#x is still held: %s", data, strings.Join(parts, "; "))
}

// ---- local handles ----

// clone counts one more handle of an object, owned or borrowed.
func (s *store) clone(id transport.ObjectID, owned bool) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return s.errClosed()
	}
	if owned {
		o, ok := s.objects[id]
		if !ok {
			return transport.Errorf(transport.ErrInternal, "owned object %s is missing while a ref is held", id)
		}
		o.local++
		return nil
	}
	e, ok := s.borrowed[id]
	if !ok {
		return transport.Errorf(transport.ErrInternal, "borrowed object %s is missing while a ref is held", id)
	}
	e.handles++
	return nil
}

// releaseOwned drops one handle of an owned object (and, with
// revokeLeases, every lease of it). It returns the object and whether it
// is being freed now.
func (s *store) releaseOwned(id transport.ObjectID, revokeLeases bool) (*object, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, false
	}
	o, ok := s.objects[id]
	if !ok {
		return nil, false
	}
	if revokeLeases {
		s.revokeLeasesLocked(o)
	}
	o.local--
	s.maybeFreeLocked(o)
	return o, o.freeing
}

// releaseBorrowed drops one handle of a borrowed object. When it was the
// last, the entry goes and the borrows registered with the owner are
// returned for the caller to send back (0: none).
func (s *store) releaseBorrowed(id transport.ObjectID) (*borrowEntry, uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, 0
	}
	e, ok := s.borrowed[id]
	if !ok {
		return nil, 0
	}
	e.handles--
	if e.handles > 0 {
		return nil, 0
	}
	delete(s.borrowed, id)
	return e, e.registered
}

// adopt turns serialized bytes of an object this runtime owns into a
// local handle, consuming their lease.
func (s *store) adopt(id transport.ObjectID, token uint64) (*object, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	o, err := s.liveObjectLocked(id)
	if err != nil {
		return nil, err
	}
	s.dropLeaseLocked(o, token)
	o.local++
	return o, nil
}

// ---- fetches ----

// addFetch records a fetch in flight, for Destroy to abort.
func (s *store) addFetch(f *Fetch) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return s.errClosed()
	}
	s.fetches[f] = struct{}{}
	return nil
}

func (s *store) removeFetch(f *Fetch) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.fetches, f)
}

// object is an owned object's record, for a local copy (nil once the
// runtime is destroyed).
func (s *store) object(id transport.ObjectID) *object {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.objects[id]
}

// ---- stats ----

// counts fills the store's part of Stats.
func (s *store) counts(st *Stats) {
	s.mu.Lock()
	defer s.mu.Unlock()
	st.Objects = uint64(len(s.objects))
	for _, o := range s.objects {
		st.Borrows += o.borrowTotal
		st.RefsInTransit += uint64(len(o.transit))
	}
	st.BorrowedObjects = uint64(len(s.borrowed))
}
