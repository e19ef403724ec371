package engine

import (
	"context"

	"github.com/rdt-project/rdt/core/control"
	"github.com/rdt-project/rdt/core/transport"
)

// The store's entries for other runtimes' objects this runtime borrows.

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

// borrowConfirmed waits, under ctx(), until the owner has answered every
// borrow request of obj and returns the first refusal.
func (s *store) borrowConfirmed(ctx func() context.Context, obj transport.ObjectID) error {
	e, ch, refused := s.borrowState(obj)
	if refused != nil || ch == nil {
		return refused
	}
	wctx := ctx()
	select {
	case <-ch:
	case <-wctx.Done():
		return transport.ContextError(wctx, "waiting for the owner %s to answer the borrow of object %s", e.peer.Info().Address, obj)
	}
	return s.refusal(e)
}
