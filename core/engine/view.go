package engine

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/rdt-project/rdt/core/transport"
)

// ViewOptions adjust one view.
type ViewOptions struct {
	// Transport names the transport that maps the owner's bytes ("": the
	// first registered one that can, shm among the built-in ones).
	Transport string
	// Private maps copy-on-write: the view may be written, and what is
	// written stays in this process.
	Private bool
}

// View is an object's tensors readable where they lie, with no copy per
// reader: a runtime's own object's put tensors, or a same-host owner's
// staged bytes mapped into this process (transport.Viewer), read-only or
// copy-on-write. It holds its own handle on the object (for a borrowed
// object, a borrow the owner counts) until Release. A mapping outlives the
// owner and never changes: a reader never sees freed or reused memory.
type View struct {
	rt       *Runtime
	ref      *Ref
	tensors  []transport.Tensor
	m        transport.Mapping // nil for a runtime's own object
	released atomic.Bool
}

// Tensors are the object's tensors as this process reads them.
func (v *View) Tensors() []transport.Tensor { return v.tensors }

// nbytes is what the view's tensors hold.
func (v *View) nbytes() uint64 {
	var n uint64
	for _, t := range v.ref.desc.Tensors {
		n += t.Nbytes
	}
	return n
}

// Mapped reports whether the view maps another process's bytes (false: a
// runtime's own object's tensors).
func (v *View) Mapped() bool { return v.m != nil }

// Release unmaps the view and drops its handle on the object. Releasing
// twice is ErrInvalidArgument.
func (v *View) Release() error {
	if v == nil || !v.released.CompareAndSwap(false, true) {
		return transport.Errorf(transport.ErrInvalidArgument, "view was already released")
	}
	var err error
	if v.m != nil {
		err = v.m.Close()
		v.rt.c.viewsOpen.Add(-1)
		v.rt.c.bytesViewed.Add(-int64(v.nbytes()))
	}
	if rerr := v.ref.Release(); err == nil {
		err = rerr
	}
	return err
}

// View makes a view of r's object within timeout (negative: no limit).
// The owner must be this runtime or on this host, and every tensor in host
// memory: anything else is ErrUnsupported, and a copy (a fetch) is the
// way. See rdt_view_open.
func (rt *Runtime) View(r *Ref, opts ViewOptions, timeout time.Duration) (*View, error) {
	if err := r.check(); err != nil {
		return nil, err
	}
	if r.rt != rt {
		return nil, transport.Errorf(transport.ErrInvalidArgument, "ref belongs to runtime %s, not %s", r.rt.me.name, rt.me.name)
	}
	if err := checkDirection([]*Ref{r}, transport.Read); err != nil {
		return nil, err
	}
	desc := r.desc
	for i, t := range desc.Tensors {
		if !t.Device.Type.HostAccessible() {
			return nil, transport.Errorf(transport.ErrUnsupported, "tensor %d of object %s is in %s memory: a view maps host memory (fetch it instead)", i, desc.ID, t.Device)
		}
	}
	if opts.Transport != "" { // named: it must be one that maps, whoever owns the object
		if _, _, err := rt.reg.viewer(opts.Transport); err != nil {
			return nil, err
		}
	}
	if timeout == 0 && !r.owned {
		return nil, transport.Errorf(transport.ErrTimeout, "timeout 0 leaves no time to reach the owner of object %s at %s: nothing was mapped", desc.ID, desc.Owner.Address)
	}
	own, err := r.Clone()
	if err != nil {
		return nil, err
	}
	v := &View{rt: rt, ref: own}
	if r.owned {
		err = v.ofOwn()
	} else {
		err = v.mapFromOwner(opts, timeout)
	}
	if err != nil {
		own.Release()
		return nil, err
	}
	return v, nil
}

// ofOwn views a runtime's own object: its put tensors.
func (v *View) ofOwn() error {
	o := v.rt.store.object(v.ref.desc.ID)
	if o == nil {
		return transport.Errorf(transport.ErrClosed, "runtime %s was destroyed", v.rt.me.name)
	}
	v.tensors = append([]transport.Tensor(nil), o.tensors...)
	return nil
}

// mapFromOwner maps a borrowed object: connect to its owner, wait until it
// counted the borrow, get the viewing transport's metadata, and map.
func (v *View) mapFromOwner(opts ViewOptions, timeout time.Duration) error {
	rt, desc := v.rt, v.ref.desc
	var deadline time.Time
	var ctx context.Context
	var cancel context.CancelFunc
	if timeout >= 0 {
		deadline = time.Now().Add(timeout)
		ctx, cancel = context.WithDeadlineCause(rt.ctx, deadline, errViewDeadline)
	} else {
		ctx, cancel = context.WithCancel(rt.ctx)
	}
	defer cancel()
	waitOwner := func() context.Context { return ctx }
	peer, err := rt.routes.connectOwner(ctx, desc)
	if err != nil {
		return err
	}
	if !rt.Identity().SameHost(peer.Info()) {
		return transport.Errorf(transport.ErrUnsupported, "a view maps the owner's memory, and the owner of object %s (%s) is on another host: fetch it instead", desc.ID, peer.Info().Name)
	}
	if err := rt.store.borrowConfirmed(waitOwner, desc.ID); err != nil {
		return err
	}
	e, viewer, err := rt.reg.viewer(opts.Transport)
	if err != nil {
		return err
	}
	r, err := rt.routes.resolve(&routeQuery{dir: transport.Read, maps: true, desc: desc, peer: peer, wait: waitOwner}, e.desc.Name)
	if err != nil {
		return err
	}
	name := e.desc.Name
	m, err := viewer.View(&r.x, r.tmeta, opts.Private, deadline)
	if err != nil {
		return transportError(name, err)
	}
	data := m.Data()
	if err := checkMapped(desc, data, m.Sizes()); err != nil {
		m.Close()
		return transportError(name, err)
	}
	v.tensors = make([]transport.Tensor, len(desc.Tensors))
	for i, t := range desc.Tensors {
		t.Device = transport.Device{Type: transport.DeviceCPU}
		v.tensors[i] = transport.Tensor{TensorDesc: t, Data: data[i], Orig: data[i]}
	}
	v.m = m
	rt.c.viewsOpen.Add(1)
	rt.c.bytesViewed.Add(int64(v.nbytes()))
	return nil
}

// checkMapped refuses a view whose ref disagrees with the owner's
// metadata: a tensor count or size other than what is mapped. A ref's
// shapes can be rewritten by whoever holds its bytes (its checksum guards
// against accidents, not against that); a reader that trusted them would
// read past the mapping, as a fetch that trusted them would write past its
// targets, which it refuses the same way.
func checkMapped(desc *ObjectDesc, data []uintptr, sizes []uint64) error {
	if len(data) != len(desc.Tensors) || len(sizes) != len(desc.Tensors) {
		return transport.Errorf(transport.ErrCorrupt, "the owner's metadata describes %d tensors (%d mapped), the ref of object %s %d: refusing the ref", len(sizes), len(data), desc.ID, len(desc.Tensors))
	}
	for i, t := range desc.Tensors {
		if sizes[i] != t.Nbytes {
			return transport.Errorf(transport.ErrCorrupt, "tensor %d of object %s is %d bytes in the owner's metadata, %d in the ref (shape %v, %s): refusing the ref", i, desc.ID, sizes[i], t.Nbytes, t.Shape, t.DType)
		}
	}
	return nil
}

var errViewDeadline = transport.Errorf(transport.ErrTimeout, "the view's deadline passed")
