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
	if err := rt.store.clone(r.desc.ID, r.owned); err != nil {
		return nil, err
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
	if r.owned {
		o, freed := rt.store.releaseOwned(r.desc.ID, revokeLeases)
		if freed && revokeLeases {
			// Freed at once means no transport serves it once we return:
			// a fetch from bytes whose borrow the owner refuses would
			// otherwise still read it until garbage_collect ran. The
			// release callback runs afterwards, on the runtime's goroutine.
			<-o.collected
		}
		return nil
	}
	if e, n := rt.store.releaseBorrowed(r.desc.ID); n > 0 {
		if r.desc.Writable {
			rt.adm.closeHeldOf(r.desc.ID) // before the owner hears we let go
		}
		e.peer.Unborrow(r.desc.ID, n)
	}
	return nil
}

// Serialize encodes the reference with a fresh lease token.
func (r *Ref) Serialize() ([]byte, error) {
	if err := r.check(); err != nil {
		return nil, err
	}
	rt := r.rt
	if r.owned {
		o, token, err := rt.store.leaseOwned(r.desc.ID)
		if err != nil {
			return nil, err
		}
		o.metaMu.Lock()
		b := EncodeRef(o.desc, o.meta, token)
		o.metaMu.Unlock()
		return b, nil
	}
	e, closed := rt.store.borrowing(r.desc.ID)
	if closed {
		return nil, transport.Errorf(transport.ErrClosed, "runtime %s was destroyed", rt.me.name)
	}
	if e == nil {
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
	if err := rt.store.checkOpen(); err != nil {
		return nil, err
	}
	if desc.Owner.RuntimeID == rt.me.id {
		o, err := rt.store.adopt(desc.ID, token)
		if err != nil {
			return nil, err
		}
		rt.c.refs.Add(1)
		return &Ref{rt: rt, desc: o.desc, owned: true}, nil
	}
	// The runtime's end also ends the wait.
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stop := context.AfterFunc(rt.ctx, func() { cancel(transport.Errorf(transport.ErrClosed, "runtime %s was destroyed", rt.me.name)) })
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
	// The borrow goes where the entry's unborrow will: on one connection
	// they arrive in order, while an unborrow on another could overtake it
	// and be refused by the owner as returning more than was counted.
	e, peer, err := rt.store.borrow(desc.ID, peer)
	if err != nil {
		return nil, err
	}
	rt.c.refs.Add(1)
	ref := &Ref{rt: rt, desc: desc}
	var mu sync.Mutex
	var answered bool
	var answer error
	peer.BorrowAsync(ctx, desc.ID, token, func(err error) {
		rt.store.borrowAnswered(e, desc, err)
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
