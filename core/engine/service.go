package engine

import (
	"context"
	"math/bits"
	"time"

	"github.com/rdt-project/rdt/core/control"
	"github.com/rdt-project/rdt/core/transport"
)

// The Runtime's side of the control plane: what peers may ask of it.

var _ control.PeerService = (*Runtime)(nil)

// Borrow implements PeerService.
func (rt *Runtime) Borrow(from transport.PeerInfo, obj transport.ObjectID, token uint64) error {
	return rt.store.lendTo(from.RuntimeID, obj, token)
}

// Unborrow implements PeerService.
func (rt *Runtime) Unborrow(from transport.RuntimeID, obj transport.ObjectID, n uint64) {
	if held, counted := rt.store.returnedBy(from, obj, n); counted && n > held {
		rt.log.Warnf("peer %s returned %d borrows of object %s but held %d", from, n, obj, held)
	}
}

// MaxLeasesPerPeer bounds the leases one peer holds at a time: refs it
// serialized that were not deserialized yet. Each costs a timer for the
// lease's duration, so a peer asking in a loop would otherwise grow the
// owner without bound. MaxPeerLeases bounds those of all peers together:
// with the token a new identity costs one handshake, so a cap per peer
// alone bounds nothing (12 identities held 49,152 leases).
const (
	MaxLeasesPerPeer = 4096
	MaxPeerLeases    = 4 * MaxLeasesPerPeer
)

// Lease implements PeerService.
func (rt *Runtime) Lease(from transport.RuntimeID, obj transport.ObjectID) (uint64, error) {
	return rt.store.leaseForPeer(from, obj)
}

// Metadata implements PeerService.
func (rt *Runtime) Metadata(from transport.RuntimeID, obj transport.ObjectID, transportName string) ([]byte, error) {
	e, err := rt.reg.lookup(transportName)
	if err != nil {
		return nil, err
	}
	o, err := rt.store.pin(obj)
	if err != nil {
		return nil, err
	}
	defer rt.store.unpin(o)
	if o.write != nil {
		// Its metadata says where it lies (for some transports, lets a peer
		// write there): it goes only with an admitted write (OpenWrite).
		return nil, transport.Errorf(transport.ErrPermissionDenied, "object %s is exposed for writing: its metadata is given only to a write its key admits", obj)
	}
	return o.metadata(e)
}

// Send implements PeerService: the source runtime (not the application)
// runs a two-sided transport's send on its own goroutine.
func (rt *Runtime) Send(ctx context.Context, from transport.PeerInfo, req control.SendRequest) error {
	e, err := rt.reg.lookup(req.Transport)
	if err != nil {
		return err
	}
	t, name := e.t, e.desc.Name
	if e.sender == nil {
		return transport.Errorf(transport.ErrInvalidArgument, "transport %s is one-sided: the source does not send", name)
	}
	o, err := rt.store.pin(req.Object)
	if err != nil {
		return err
	}
	tmeta, err := o.metadata(e)
	if err != nil {
		rt.store.unpin(o)
		return err
	}
	x := &transport.Transfer{
		Object: req.Object, TransferID: req.TransferID, Transport: name, Role: transport.RoleSource,
		Source: rt.Identity(), Destination: from, Pieces: req.Pieces,
	}
	nbytes := o.desc.Nbytes
	if req.Pieces != nil {
		// The destination's pieces are checked against what was put: a
		// peer names ranges, never addresses.
		if nbytes, err = checkSendPieces(e, o.tensors, req.Pieces); err != nil {
			rt.store.unpin(o)
			return err
		}
	}
	done := make(chan error, 1)
	rt.bg.Add(1)
	go func() {
		defer rt.bg.Done()
		defer rt.store.unpin(o) // the memory is read until Send returns
		start := time.Now()
		err := e.sender.Send(x, o.tensors, tmeta, req.CMeta)
		if err == nil {
			e.sends.add(nbytes, nil)
			rt.c.sendsCompleted.Add(1)
			rt.c.bytesSent.Add(nbytes)
			rt.log.Debugf("sent object %s to %s over %s: %d bytes in %v", req.Object, from, name, nbytes, time.Since(start))
		} else {
			rt.log.Warnf("send of object %s to %s over %s failed: %v", req.Object, from, name, err)
		}
		done <- err
	}()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
	case <-rt.ctx.Done():
	}
	if e.desc.CanAbort {
		t.Abort(x, nil)
		<-done
	}
	return transport.Errorf(transport.ErrAborted, "send of object %s over %s was aborted", req.Object, name)
}

// PeerGone implements PeerService: a lost peer's borrows are returned, and
// transports that keep per-peer state (descriptors, pooled connections)
// are told to drop it, so a long-lived runtime fed by short-lived peers
// does not grow.
func (rt *Runtime) PeerGone(peer transport.PeerInfo) {
	rt.gate.writersGone(peer)
	rt.peerBorrowsGone(peer.RuntimeID)
	for _, e := range rt.reg.all() {
		if w, ok := e.t.(transport.PeerWatcher); ok {
			w.PeerGone(peer)
		}
	}
}

func (rt *Runtime) peerBorrowsGone(id transport.RuntimeID) {
	if returned := rt.store.peerGone(id); returned > 0 {
		rt.log.Infof("peer %s is gone: dropped its %d borrows", id, returned)
	}
}

// checkSendPieces checks a destination's pieces against the put tensors
// and returns the bytes they take.
func checkSendPieces(e *registered, tensors []transport.Tensor, pieces []transport.Piece) (uint64, error) {
	if !e.desc.Ranges {
		return 0, transport.Errorf(transport.ErrUnsupported, "transport %s cannot serve a partial fetch", e.desc.Name)
	}
	return checkPieces(tensors, pieces)
}

// checkPieces checks pieces a peer named against an object's tensors and
// returns the bytes they take. Pieces may name the same bytes again, so
// their total is not bounded by the object's size: one that does not fit
// in 64 bits is refused rather than wrapped.
func checkPieces(tensors []transport.Tensor, pieces []transport.Piece) (uint64, error) {
	var total uint64
	for i, p := range pieces {
		if int64(p.Tensor) >= int64(len(tensors)) {
			return 0, transport.Errorf(transport.ErrInvalidArgument, "piece %d names tensor %d of %d", i, p.Tensor, len(tensors))
		}
		if n := tensors[p.Tensor].Nbytes; !p.Within(n) {
			return 0, transport.Errorf(transport.ErrInvalidArgument, "piece %d asks for bytes [%d, +%d) of tensor %d, which is %d bytes", i, p.Offset, p.Length, p.Tensor, n)
		}
		var carry uint64
		if total, carry = bits.Add64(total, p.Length, 0); carry != 0 {
			return 0, transport.Errorf(transport.ErrInvalidArgument, "the %d pieces add up to more than 2^64 bytes", len(pieces))
		}
	}
	return total, nil
}
