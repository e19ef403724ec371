package engine

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rdt-project/rdt/core/transport"
)

// Ref is one counted handle to an object, owned by one runtime.
type Ref struct {
	rt       *Runtime
	desc     *ObjectDesc
	owned    bool // rt owns the object
	released atomic.Bool
}

// Runtime is the runtime the handle belongs to.
func (r *Ref) Runtime() *Runtime { return r.rt }

// Desc describes the object.
func (r *Ref) Desc() *ObjectDesc { return r.desc }

// IsOwner reports whether the handle's runtime owns the object.
func (r *Ref) IsOwner() bool { return r.owned }

func (r *Ref) check() error {
	if r == nil || r.released.Load() {
		return transport.Errorf(transport.ErrInvalidArgument, "ref was released")
	}
	return nil
}

// Clone makes another handle to the same object.
func (r *Ref) Clone() (*Ref, error) {
	if err := r.check(); err != nil {
		return nil, err
	}
	rt := r.rt
	rt.mu.Lock()
	defer rt.mu.Unlock()
	if rt.closed {
		return nil, transport.Errorf(transport.ErrClosed, "runtime %s was destroyed", rt.name)
	}
	if r.owned {
		o, ok := rt.objects[r.desc.ID]
		if !ok {
			return nil, transport.Errorf(transport.ErrInternal, "owned object %s is missing while a ref is held", r.desc.ID)
		}
		o.local++
	} else {
		e, ok := rt.borrowed[r.desc.ID]
		if !ok {
			return nil, transport.Errorf(transport.ErrInternal, "borrowed object %s is missing while a ref is held", r.desc.ID)
		}
		e.handles++
	}
	rt.c.refs.Add(1)
	return &Ref{rt: rt, desc: r.desc, owned: r.owned}, nil
}

// Release drops the handle. Releasing twice is ErrInvalidArgument.
func (r *Ref) Release() error { return r.release(false) }

// ReleaseRevokingLeases drops the handle of an owner and ends every lease
// of the object at once, as if each had expired: serialized bytes not
// deserialized yet (the owner's and those its borrowers asked for) stop
// holding it, so it is freed as soon as no local handle and no borrow is
// left. Bytes deserialized afterwards, and a borrow request made from them
// that reaches the owner only afterwards, are then refused with ErrNotFound
// ("already freed"); while borrows keep the object, they make a borrow as
// expired bytes do. Borrows already counted are kept. A borrowed handle
// cannot revoke its owner's leases: ErrInvalidArgument, and the handle
// stays valid.
func (r *Ref) ReleaseRevokingLeases() error {
	if err := r.check(); err != nil {
		return err
	}
	if !r.owned {
		return transport.Errorf(transport.ErrInvalidArgument, "ref to object %s is borrowed: only its owner %s can revoke the object's leases; release it without revoking",
			r.desc.ID, r.desc.Owner.Address)
	}
	return r.release(true)
}

func (r *Ref) release(revokeLeases bool) error {
	if r == nil || !r.released.CompareAndSwap(false, true) {
		return transport.Errorf(transport.ErrInvalidArgument, "ref was already released")
	}
	rt := r.rt
	rt.c.refs.Add(-1)
	rt.mu.Lock()
	if rt.closed {
		rt.mu.Unlock()
		return nil
	}
	if r.owned {
		o, ok := rt.objects[r.desc.ID]
		freed := false
		if ok {
			if revokeLeases {
				rt.revokeLeasesLocked(o)
			}
			o.local--
			rt.maybeFreeLocked(o)
			freed = o.freeing
		}
		rt.mu.Unlock()
		if freed && revokeLeases {
			// Freed at once means no transport serves it once we return:
			// a fetch from bytes whose borrow the owner refuses would
			// otherwise still read it until garbage_collect ran. The
			// release callback runs afterwards, on the runtime's goroutine.
			<-o.collected
		}
		return nil
	}
	e, ok := rt.borrowed[r.desc.ID]
	if !ok {
		rt.mu.Unlock()
		return nil
	}
	e.handles--
	if e.handles > 0 {
		rt.mu.Unlock()
		return nil
	}
	delete(rt.borrowed, r.desc.ID)
	n := e.registered
	rt.mu.Unlock()
	if n > 0 {
		e.peer.Unborrow(r.desc.ID, n)
	}
	return nil
}

// borrowAnswered records the owner's answer to one borrow request.
func (rt *Runtime) borrowAnswered(e *borrowEntry, desc *ObjectDesc, err error) {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	if err != nil {
		e.registered-- // the owner did not count it
		if e.refused == nil {
			e.refused = transport.Wrap(err, "owner %s refused the borrow of object %s", desc.Owner.Address, desc.ID)
		}
		rt.log.Debugf("borrow of object %s refused by %s: %v", desc.ID, desc.Owner.Address, err)
	}
	e.unconfirmed--
	if e.unconfirmed == 0 {
		close(e.confirmed)
	}
}

// borrowRefused is the owner's refusal of a borrow of obj, if one arrived.
func (rt *Runtime) borrowRefused(obj transport.ObjectID) error {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	if e := rt.borrowed[obj]; e != nil {
		return e.refused
	}
	return nil
}

// borrowConfirmed waits, under ctx(), until the owner has answered every
// borrow request of obj and returns the first refusal.
func (rt *Runtime) borrowConfirmed(ctx func() context.Context, obj transport.ObjectID) error {
	rt.mu.Lock()
	e := rt.borrowed[obj]
	if e == nil {
		rt.mu.Unlock()
		return nil
	}
	ch, refused := e.confirmed, e.refused
	pending := e.unconfirmed > 0
	rt.mu.Unlock()
	if refused != nil || !pending {
		return refused
	}
	wctx := ctx()
	select {
	case <-ch:
	case <-wctx.Done():
		return transport.ContextError(wctx, "waiting for the owner %s to answer the borrow of object %s", e.peer.Info().Address, obj)
	}
	rt.mu.Lock()
	defer rt.mu.Unlock()
	return e.refused
}

// Serialize encodes the reference with a fresh lease token.
func (r *Ref) Serialize() ([]byte, error) {
	if err := r.check(); err != nil {
		return nil, err
	}
	rt := r.rt
	if r.owned {
		rt.mu.Lock()
		if rt.closed {
			rt.mu.Unlock()
			return nil, transport.Errorf(transport.ErrClosed, "runtime %s was destroyed", rt.name)
		}
		o, ok := rt.objects[r.desc.ID]
		if !ok {
			rt.mu.Unlock()
			return nil, transport.Errorf(transport.ErrInternal, "owned object %s is missing while a ref is held", r.desc.ID)
		}
		token := rt.newLeaseLocked(o, transport.RuntimeID{})
		rt.mu.Unlock()
		o.metaMu.Lock()
		b := EncodeRef(o.desc, o.meta, token)
		o.metaMu.Unlock()
		return b, nil
	}
	rt.mu.Lock()
	e, ok := rt.borrowed[r.desc.ID]
	closed := rt.closed
	rt.mu.Unlock()
	if closed {
		return nil, transport.Errorf(transport.ErrClosed, "runtime %s was destroyed", rt.name)
	}
	if !ok {
		return nil, transport.Errorf(transport.ErrInternal, "borrowed object %s is missing while a ref is held", r.desc.ID)
	}
	ctx, cancel := context.WithTimeout(rt.ctx, rpcTimeout)
	defer cancel()
	token, err := e.peer.Lease(ctx, r.desc.ID)
	if err != nil {
		return nil, transport.Wrap(err, "owner %s of object %s", r.desc.Owner.Address, r.desc.ID)
	}
	return EncodeRef(r.desc, r.desc.Meta, token), nil
}

// lease keeps an object alive for a serialized ref until it is
// deserialized or expires.
type lease struct {
	timer *time.Timer
	peer  transport.RuntimeID // the peer that asked for it (counted in peerLeases); zero: this runtime
}

// newLeaseLocked adds a lease token to o, for peer (zero: this runtime).
// Caller holds rt.mu.
func (rt *Runtime) newLeaseLocked(o *object, peer transport.RuntimeID) uint64 {
	token := transport.RandomUint64() | 1 // never 0, which means "no token"
	o.transit[token] = lease{timer: time.AfterFunc(rt.lease, func() { rt.expireLease(o, token) }), peer: peer}
	return token
}

// dropLeaseLocked ends a lease token of o, if o holds it: consumed,
// expired or revoked. Caller holds rt.mu.
func (rt *Runtime) dropLeaseLocked(o *object, token uint64) bool {
	l, ok := o.transit[token]
	if !ok {
		return false
	}
	l.timer.Stop()
	delete(o.transit, token)
	if !l.peer.IsZero() {
		if rt.peerLeases[l.peer]--; rt.peerLeases[l.peer] == 0 {
			delete(rt.peerLeases, l.peer)
		}
	}
	return true
}

func (rt *Runtime) expireLease(o *object, token uint64) {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	if rt.closed || !rt.dropLeaseLocked(o, token) {
		return
	}
	rt.c.leasesExpired.Add(1)
	rt.log.Debugf("lease of a serialized ref to object %s expired before it was deserialized", o.desc.ID)
	rt.maybeFreeLocked(o)
}

// revokeLeasesLocked drops every lease token of o, as if each had expired
// now. Caller holds rt.mu.
func (rt *Runtime) revokeLeasesLocked(o *object) {
	n := len(o.transit)
	for token := range o.transit {
		rt.dropLeaseLocked(o, token)
	}
	if n > 0 {
		rt.log.Debugf("revoked %d leases of object %s", n, o.desc.ID)
	}
}

// DefaultDeserializeTimeout bounds how long Deserialize waits for the owner
// (connecting to it, when this runtime has no connection yet).
const DefaultDeserializeTimeout = 30 * time.Second

// Deserialize turns serialized bytes into a handle of this runtime: a local
// handle if this runtime owns the object, else a borrow counted by the owner.
// It waits for the owner at most DefaultDeserializeTimeout.
func (rt *Runtime) Deserialize(b []byte) (*Ref, error) {
	return rt.DeserializeWithin(b, DefaultDeserializeTimeout)
}

var errDeserializeDeadline = transport.Errorf(transport.ErrTimeout, "the owner did not answer within the deserialize timeout")

// DeserializeWithin is Deserialize waiting for the owner at most d
// (negative: as long as the runtime lives).
func (rt *Runtime) DeserializeWithin(b []byte, d time.Duration) (*Ref, error) {
	if d < 0 {
		return rt.DeserializeContext(context.Background(), b)
	}
	ctx, cancel := context.WithTimeoutCause(context.Background(), d, errDeserializeDeadline)
	defer cancel()
	return rt.DeserializeContext(ctx, b)
}

// DeserializeContext is Deserialize waiting for the owner only as long as ctx
// allows: ErrTimeout when its deadline passes, ErrAborted when it is
// cancelled. Either way nothing is kept (no borrow is registered), so the
// same bytes may be deserialized again. A connection attempt it gave up on
// goes on in the background (bounded by the control plane's handshake
// timeout), and a later call waits for that one rather than dialing again.
func (rt *Runtime) DeserializeContext(ctx context.Context, b []byte) (*Ref, error) {
	desc, token, err := DecodeRef(b)
	if err != nil {
		return nil, err
	}
	if err := rt.checkOpen(); err != nil {
		return nil, err
	}
	if desc.Owner.RuntimeID == rt.id {
		rt.mu.Lock()
		defer rt.mu.Unlock()
		o, err := rt.liveObjectLocked(desc.ID)
		if err != nil {
			return nil, err
		}
		rt.dropLeaseLocked(o, token)
		o.local++
		rt.c.refs.Add(1)
		return &Ref{rt: rt, desc: o.desc, owned: true}, nil
	}
	// The runtime's end also ends the wait.
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stop := context.AfterFunc(rt.ctx, func() { cancel(transport.Errorf(transport.ErrClosed, "runtime %s was destroyed", rt.name)) })
	defer stop()
	peer, err := rt.ep.Connect(ctx, desc.Owner.Address)
	if err != nil {
		return nil, transport.Wrap(err, "owner of object %s", desc.ID)
	}
	if peer.Info().RuntimeID != desc.Owner.RuntimeID {
		return nil, transport.Errorf(transport.ErrPeerUnavailable, "the runtime at %s is not the owner of object %s (the owner is gone)", desc.Owner.Address, desc.ID)
	}
	// The borrow is registered without waiting for the owner's answer: the
	// lease in the bytes keeps the object alive until the request arrives,
	// and requests on one connection are served in order, so a later fetch
	// or release reaches the owner after it. A refusal (the object was
	// freed meanwhile) is kept and returned by the next fetch.
	rt.mu.Lock()
	if rt.closed {
		rt.mu.Unlock()
		return nil, transport.Errorf(transport.ErrClosed, "runtime %s was destroyed", rt.name)
	}
	e := rt.borrowed[desc.ID]
	if e == nil {
		e = &borrowEntry{peer: peer}
		rt.borrowed[desc.ID] = e
	}
	// The borrow goes where the entry's unborrow will: on one connection
	// they arrive in order, while an unborrow on another could overtake it
	// and be refused by the owner as returning more than was counted.
	peer = e.peer
	e.handles++
	e.registered++
	if e.unconfirmed == 0 {
		e.confirmed = make(chan struct{})
	}
	e.unconfirmed++
	rt.mu.Unlock()
	rt.c.refs.Add(1)
	ref := &Ref{rt: rt, desc: desc}
	var mu sync.Mutex
	var answered bool
	var answer error
	peer.BorrowAsync(ctx, desc.ID, token, func(err error) {
		rt.borrowAnswered(e, desc, err)
		mu.Lock()
		answered, answer = true, err
		mu.Unlock()
	})
	mu.Lock()
	// An owner answers a borrow with OK, NOT_FOUND or PEER_UNAVAILABLE; a
	// deadline, an abort or a close is ours, before the request went out.
	status := transport.StatusOf(answer)
	lost := answered && status == transport.ErrPeerUnavailable
	unsent := answered && (status == transport.ErrTimeout || status == transport.ErrAborted || status == transport.ErrClosed)
	mu.Unlock()
	if lost || unsent {
		// The connection failed under the request (the owner died since
		// we last heard from it), or ctx ended before the request could
		// go out: say so now rather than at the fetch.
		ref.Release()
		return nil, transport.Wrap(answer, "owner %s of object %s", desc.Owner.Address, desc.ID)
	}
	return ref, nil
}
