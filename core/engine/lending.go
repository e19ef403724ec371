package engine

import (
	"time"

	"github.com/rdt-project/rdt/core/transport"
)

// What the store lends: the leases that keep an object alive for its
// serialized refs, and the borrows peers hold on the objects it owns.

// lease keeps an object alive for a serialized ref until it is
// deserialized or expires.
type lease struct {
	timer *time.Timer
	peer  transport.RuntimeID // the peer that asked for it (counted in peerLeases); zero: this runtime
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
