package engine

import (
	"context"
	"time"

	"github.com/rdt-project/rdt/core/control"
	"github.com/rdt-project/rdt/core/transport"
)

// The Runtime's side of the control plane: what peers may ask of it.

var _ control.PeerService = (*Runtime)(nil)

// Borrow implements PeerService.
func (rt *Runtime) Borrow(from transport.PeerInfo, obj transport.ObjectID, token uint64) error {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	o, err := rt.liveObjectLocked(obj)
	if err != nil {
		return err
	}
	rt.dropLeaseLocked(o, token)
	o.borrows[from.RuntimeID]++
	o.borrowTotal++
	return nil
}

// Unborrow implements PeerService.
func (rt *Runtime) Unborrow(from transport.RuntimeID, obj transport.ObjectID, n uint64) {
	rt.mu.Lock()
	o, ok := rt.objects[obj]
	if !ok || rt.closed || o.freeing {
		rt.mu.Unlock()
		return // includes borrows we refused because the object was freed
	}
	have, asked := o.borrows[from], n
	n = min(n, have)
	if have-n == 0 {
		delete(o.borrows, from)
	} else {
		o.borrows[from] = have - n
	}
	o.borrowTotal -= n
	rt.maybeFreeLocked(o)
	rt.mu.Unlock()
	if asked > have { // logged after the lock: the control plane's reader calls this
		rt.log.Warnf("peer %s returned %d borrows of object %s but held %d", from, asked, obj, have)
	}
}

// MaxLeasesPerPeer bounds the leases one peer holds at a time: refs it
// serialized that were not deserialized yet. Each costs a timer for the
// lease's duration, so a peer asking in a loop would otherwise grow the
// owner without bound.
const MaxLeasesPerPeer = 4096

// Lease implements PeerService.
func (rt *Runtime) Lease(from transport.RuntimeID, obj transport.ObjectID) (uint64, error) {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	o, err := rt.liveObjectLocked(obj)
	if err != nil {
		return 0, err
	}
	if n := rt.peerLeases[from]; n >= MaxLeasesPerPeer {
		return 0, transport.Errorf(transport.ErrNoMemory, "runtime %s refused a lease: peer %s already holds %d leases, the limit (refs it serialized and nobody deserialized yet; they expire after %v)", rt.name, from, n, rt.lease)
	}
	rt.peerLeases[from]++
	return rt.newLeaseLocked(o, from), nil
}

// Metadata implements PeerService.
func (rt *Runtime) Metadata(from transport.RuntimeID, obj transport.ObjectID, transportName string) ([]byte, error) {
	e, err := rt.reg.lookup(transportName)
	if err != nil {
		return nil, err
	}
	rt.mu.Lock()
	o, err := rt.liveObjectLocked(obj)
	if err == nil {
		o.pins++
	}
	rt.mu.Unlock()
	if err != nil {
		return nil, err
	}
	defer rt.unpin(o)
	return rt.objectMeta(o, e)
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
	rt.mu.Lock()
	o, err := rt.liveObjectLocked(req.Object)
	if err == nil {
		o.pins++
	}
	rt.mu.Unlock()
	if err != nil {
		return err
	}
	tmeta, err := rt.objectMeta(o, e)
	if err != nil {
		rt.unpin(o)
		return err
	}
	x := &transport.Transfer{
		Object: req.Object, TransferID: req.TransferID, Transport: name, Role: transport.RoleSource,
		Source: rt.Identity(), Destination: from,
	}
	done := make(chan error, 1)
	rt.bg.Add(1)
	go func() {
		defer rt.bg.Done()
		defer rt.unpin(o) // the memory is read until Send returns
		start := time.Now()
		err := e.sender.Send(x, o.tensors, tmeta, req.CMeta)
		if err == nil {
			e.stats.SendsCompleted.Add(1)
			e.stats.BytesSent.Add(o.desc.Nbytes)
			rt.c.sendsCompleted.Add(1)
			rt.c.bytesSent.Add(o.desc.Nbytes)
			rt.log.Debugf("sent object %s to %s over %s: %d bytes in %v", req.Object, from, name, o.desc.Nbytes, time.Since(start))
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
	rt.peerBorrowsGone(peer.RuntimeID)
	for _, e := range rt.reg.all() {
		if w, ok := e.t.(transport.PeerWatcher); ok {
			w.PeerGone(peer)
		}
	}
}

func (rt *Runtime) peerBorrowsGone(id transport.RuntimeID) {
	rt.mu.Lock()
	if rt.closed {
		rt.mu.Unlock()
		return // Destroy frees everything anyway
	}
	returned := uint64(0)
	for _, o := range rt.objects {
		if n := o.borrows[id]; n > 0 {
			delete(o.borrows, id)
			o.borrowTotal -= n
			returned += n
			rt.maybeFreeLocked(o)
		}
	}
	rt.mu.Unlock()
	if returned > 0 {
		rt.log.Infof("peer %s is gone: dropped its %d borrows", id, returned)
	}
}
