package engine

import (
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/rdt-project/rdt/core/control"
	"github.com/rdt-project/rdt/core/transport"
)

// store is a runtime's object store: the objects it owns (with their
// index by data pointer, leases, the borrows peers hold, pins and the
// record of freed ids), the entries of other runtimes' objects it
// borrows, and its fetches in flight. One mutex guards all of it and only
// the store's methods take it: callers never hold it, and methods named
// ...Locked are the store's own steps, called with it held.
type store struct {
	name  string // the runtime's, for errors
	log   *transport.Logger
	lease time.Duration // how long a serialized ref keeps its object alive
	c     *counters
	// free finalizes an object nothing references any more; it runs
	// without the lock (Runtime.finalize on a goroutine of the runtime).
	free func(o *object)

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

// borrowEntry is a borrower's record of another runtime's object.
type borrowEntry struct {
	peer       control.Peer
	handles    int64
	registered uint64 // borrows registered with the owner, not yet returned
	meta       map[string][]byte

	unconfirmed int           // borrow requests the owner has not answered
	confirmed   chan struct{} // closed when unconfirmed drops to 0
	refused     error         // the owner's first refusal, returned by fetches
}

// lease keeps an object alive for a serialized ref until it is
// deserialized or expires.
type lease struct {
	timer *time.Timer
	peer  transport.RuntimeID // the peer that asked for it (counted in peerLeases); zero: this runtime
}

func newStore(name string, log *transport.Logger, leaseFor time.Duration, c *counters, free func(*object)) *store {
	return &store{
		name: name, log: log, lease: leaseFor, c: c, free: free,
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
	s.free(o)
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

// ---- leases ----

// leaseOwned makes a lease token for a serialized ref of an owned object.
func (s *store) leaseOwned(id transport.ObjectID) (*object, uint64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, 0, s.errClosed()
	}
	o, ok := s.objects[id]
	if !ok {
		return nil, 0, transport.Errorf(transport.ErrInternal, "owned object %s is missing while a ref is held", id)
	}
	return o, s.newLeaseLocked(o, transport.RuntimeID{}), nil
}

// leaseForPeer makes a lease token a peer asked for, up to
// MaxLeasesPerPeer at a time and MaxPeerLeases for all peers.
func (s *store) leaseForPeer(from transport.RuntimeID, id transport.ObjectID) (uint64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	o, err := s.liveObjectLocked(id)
	if err != nil {
		return 0, err
	}
	if n := s.peerLeases[from]; n >= MaxLeasesPerPeer {
		return 0, transport.Errorf(transport.ErrNoMemory, "runtime %s refused a lease: peer %s already holds %d leases, the limit (refs it serialized and nobody deserialized yet; they expire after %v)", s.name, from, n, s.lease)
	}
	if s.peerLeasesHeld >= MaxPeerLeases {
		return 0, transport.Errorf(transport.ErrNoMemory, "runtime %s refused a lease: its peers together already hold %d leases, the limit for all of them (refs they serialized and nobody deserialized yet; they expire after %v)", s.name, s.peerLeasesHeld, s.lease)
	}
	s.peerLeases[from]++
	s.peerLeasesHeld++
	return s.newLeaseLocked(o, from), nil
}

// newLeaseLocked adds a lease token to o, for peer (zero: this runtime).
func (s *store) newLeaseLocked(o *object, peer transport.RuntimeID) uint64 {
	token := transport.RandomUint64() | 1 // never 0, which means "no token"
	o.transit[token] = lease{timer: time.AfterFunc(s.lease, func() { s.expireLease(o, token) }), peer: peer}
	return token
}

// dropLeaseLocked ends a lease token of o, if o holds it: consumed,
// expired or revoked.
func (s *store) dropLeaseLocked(o *object, token uint64) bool {
	l, ok := o.transit[token]
	if !ok {
		return false
	}
	l.timer.Stop()
	delete(o.transit, token)
	if !l.peer.IsZero() {
		s.peerLeasesHeld--
		if s.peerLeases[l.peer]--; s.peerLeases[l.peer] == 0 {
			delete(s.peerLeases, l.peer)
		}
	}
	return true
}

func (s *store) expireLease(o *object, token uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed || !s.dropLeaseLocked(o, token) {
		return
	}
	s.c.leasesExpired.Add(1)
	s.log.Debugf("lease of a serialized ref to object %s expired before it was deserialized", o.desc.ID)
	s.maybeFreeLocked(o)
}

// revokeLeases drops every lease token of o, then frees it if nothing
// else holds it.
func (s *store) revokeLeases(o *object) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed || o.freeing {
		return
	}
	s.revokeLeasesLocked(o)
	s.maybeFreeLocked(o)
}

// revokeLeasesLocked drops every lease token of o, as if each had expired
// now.
func (s *store) revokeLeasesLocked(o *object) {
	n := len(o.transit)
	for token := range o.transit {
		s.dropLeaseLocked(o, token)
	}
	if n > 0 {
		s.log.Debugf("revoked %d leases of object %s", n, o.desc.ID)
	}
}

// ---- borrows peers hold on our objects ----

// lendTo counts a peer's borrow of an object, consuming the lease of the
// bytes it deserialized.
func (s *store) lendTo(from transport.RuntimeID, id transport.ObjectID, token uint64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	o, err := s.liveObjectLocked(id)
	if err != nil {
		return err
	}
	s.dropLeaseLocked(o, token)
	o.borrows[from]++
	o.borrowTotal++
	return nil
}

// returnedBy takes back n of a peer's borrows of an object and reports
// how many it held (fewer than n is the peer's mistake, for a warning).
// counted is false for an object gone or being freed: its borrows were
// refused, and none are counted.
func (s *store) returnedBy(from transport.RuntimeID, id transport.ObjectID, n uint64) (held uint64, counted bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	o, ok := s.objects[id]
	if !ok || s.closed || o.freeing {
		return 0, false
	}
	held = o.borrows[from]
	n = min(n, held)
	if held-n == 0 {
		delete(o.borrows, from)
	} else {
		o.borrows[from] = held - n
	}
	o.borrowTotal -= n
	s.maybeFreeLocked(o)
	return held, true
}

// peerGone drops every borrow a lost peer held and reports how many.
func (s *store) peerGone(id transport.RuntimeID) uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return 0 // Destroy frees everything anyway
	}
	returned := uint64(0)
	for _, o := range s.objects {
		if n := o.borrows[id]; n > 0 {
			delete(o.borrows, id)
			o.borrowTotal -= n
			returned += n
			s.maybeFreeLocked(o)
		}
	}
	return returned
}

// ---- our borrows of other runtimes' objects ----

// borrow records one more handle and one more borrow request of another
// runtime's object, made over peer unless the entry has a connection
// already; it returns the entry and the peer the request must go to.
func (s *store) borrow(id transport.ObjectID, peer control.Peer) (*borrowEntry, control.Peer, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, nil, s.errClosed()
	}
	e := s.borrowed[id]
	if e == nil {
		e = &borrowEntry{peer: peer}
		s.borrowed[id] = e
	}
	e.handles++
	e.registered++
	if e.unconfirmed == 0 {
		e.confirmed = make(chan struct{})
	}
	e.unconfirmed++
	return e, e.peer, nil
}

// borrowing is the entry of a borrowed object, and whether the store is
// closed.
func (s *store) borrowing(id transport.ObjectID) (*borrowEntry, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.borrowed[id], s.closed
}

// borrowAnswered records the owner's answer to one borrow request.
func (s *store) borrowAnswered(e *borrowEntry, desc *ObjectDesc, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err != nil {
		e.registered-- // the owner did not count it
		if e.refused == nil {
			e.refused = transport.Wrap(err, "owner %s refused the borrow of object %s", desc.Owner.Address, desc.ID)
		}
		s.log.Debugf("borrow of object %s refused by %s: %v", desc.ID, desc.Owner.Address, err)
	}
	e.unconfirmed--
	if e.unconfirmed == 0 {
		close(e.confirmed)
	}
}

// borrowRefused is the owner's refusal of a borrow of id, if one arrived.
func (s *store) borrowRefused(id transport.ObjectID) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if e := s.borrowed[id]; e != nil {
		return e.refused
	}
	return nil
}

// borrowState is what a fetch waits on: the entry, the channel closed once
// the owner answered every borrow request, and its refusal so far. A nil
// channel means nothing is pending.
func (s *store) borrowState(id transport.ObjectID) (*borrowEntry, chan struct{}, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.borrowed[id]
	if e == nil {
		return nil, nil, nil
	}
	if e.unconfirmed == 0 {
		return e, nil, e.refused
	}
	return e, e.confirmed, e.refused
}

// refusal is e's refusal, once answered.
func (s *store) refusal(e *borrowEntry) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return e.refused
}

// cachedMeta is a transport's metadata of a borrowed object, if asked of
// the owner before.
func (s *store) cachedMeta(id transport.ObjectID, name string) ([]byte, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if e := s.borrowed[id]; e != nil {
		m, ok := e.meta[name]
		return m, ok
	}
	return nil, false
}

// cacheMeta keeps metadata the owner gave for a borrowed object.
func (s *store) cacheMeta(id transport.ObjectID, name string, m []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if e := s.borrowed[id]; e != nil {
		if e.meta == nil {
			e.meta = map[string][]byte{}
		}
		e.meta[name] = m
	}
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
