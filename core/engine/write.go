package engine

import (
	"time"

	"github.com/rdt-project/rdt/core/control"
	"github.com/rdt-project/rdt/core/transport"
)

// The writer's side of writes into exposed objects (see exposure.go for
// the protocol and the owner's side): a write is a Fetch whose transfers
// ask the owner to admit them, move the bytes with a transport's Write and
// tell the owner the outcome.

// WriteOptions adjust one write.
type WriteOptions struct {
	// Transport overrides the transport of every ref ("" keeps each ref's
	// own or the automatic choice).
	Transport string
	// Destinations, when not nil, place source i at Destinations[i]: a
	// byte range of one tensor of one of the refs (as a partial fetch's
	// Sources name them). Nil: one source per tensor, ref after ref, whole.
	Destinations []Source
	// Tag is handed to the owner with each write's notice (a version, say).
	Tag uint64
}

// writeMode marks a Fetch that writes.
type writeMode struct{ tag uint64 }

// StartWrite starts writing sources into the objects of writable refs and
// returns at once, like StartFetch: the write is waited on, aborted and
// freed as a fetch is. See rdt_write_start.
func (rt *Runtime) StartWrite(refs []*Ref, sources []transport.Tensor, opts WriteOptions) (*Fetch, error) {
	return rt.StartFetch(refs, sources, opts.fetchOptions())
}

// Write is StartWrite, Wait and Free in one call, under one deadline, like
// Get.
func (rt *Runtime) Write(refs []*Ref, sources []transport.Tensor, opts WriteOptions, timeout time.Duration) error {
	return rt.Get(refs, sources, opts.fetchOptions(), timeout)
}

func (o WriteOptions) fetchOptions() FetchOptions {
	return FetchOptions{Transport: o.Transport, Sources: o.Destinations, write: &writeMode{tag: o.Tag}}
}

// checkDirection refuses refs the operation cannot use: a fetch reads
// objects that were put, a write writes objects exposed for writing.
func checkDirection(refs []*Ref, write bool) error {
	for i, r := range refs {
		switch {
		case write && !r.desc.Writable:
			return transport.Errorf(transport.ErrInvalidArgument, "ref %d (object %s) is not writable: only refs of exposed objects are written into", i, r.desc.ID)
		case !write && r.desc.Writable:
			return transport.Errorf(transport.ErrInvalidArgument, "ref %d (object %s) was exposed for writing: it is written into, never fetched", i, r.desc.ID)
		}
	}
	return nil
}

// checkWriteDevices refuses a write between device types a transport would
// have to convert: writes move host memory into host memory, or between
// memory of one device type.
func (tr *transfer) checkWriteDevices() error {
	desc := tr.ref.desc
	for i, src := range tr.targets {
		dst := desc.Tensors[pieceTensor(tr.pieces, i)]
		if src.Device.Type != dst.Device.Type && !(src.Device.Type.HostAccessible() && dst.Device.Type.HostAccessible()) {
			return transport.Errorf(transport.ErrUnsupported, "source %d is in %s memory and its destination in %s memory: writes do not cross device types", i, src.Device.Type, dst.Device.Type)
		}
	}
	return nil
}

// beginWrite is the start phase of a write: connect to the owner, choose a
// transport that writes, have the owner admit the write, and start it.
func (tr *transfer) beginWrite() error {
	rt := tr.f.rt
	desc := tr.ref.desc
	if err := tr.checkWriteDevices(); err != nil {
		return err
	}
	tr.x = &transport.Transfer{Object: desc.ID, TransferID: transport.RandomUint64(), Role: transport.RoleSource, Direction: transport.Write, Source: rt.Identity(), Pieces: tr.pieces}
	if tr.ref.owned {
		tr.local = true
		tr.x.Transport = "local copy"
		return rt.admitWriteLocal(tr)
	}
	if err := tr.connectOwner(); err != nil {
		return err
	}
	candidates, auto := tr.candidates(rt.writeCandidates)
	if auto && len(candidates) == 0 {
		return transport.Errorf(transport.ErrUnsupported, "no transport in this runtime writes %s memory into %s (have: %v)", desc.Tensors[0].Device.Type, tr.peer.Info(), rt.reg.Names())
	}
	var firstErr error
	for _, name := range candidates {
		err := tr.beginWriteWith(name)
		if err == nil {
			return nil
		}
		// Once the owner admitted the write, its notice will say how this
		// one ended: no other transport tries it again.
		if st := transport.StatusOf(err); tr.opened || len(candidates) == 1 || (st != transport.ErrUnsupported && st != transport.ErrPermissionDenied) {
			return err
		}
		if firstErr == nil {
			firstErr = err
		}
	}
	return firstErr
}

// writeCandidates are the transports that write, in the automatic order
// for the object's memory and the owner's place.
func (rt *Runtime) writeCandidates(desc *ObjectDesc, peer transport.PeerInfo) []string {
	var out []string
	for _, name := range rt.autoCandidates(desc, peer) {
		if e, err := rt.reg.lookup(name); err == nil && e.writer != nil {
			out = append(out, name)
		}
	}
	return out
}

// beginWriteWith has the owner admit the write over transport name, then
// starts the transport's write.
func (tr *transfer) beginWriteWith(name string) error {
	rt := tr.f.rt
	desc := tr.ref.desc
	e, err := rt.reg.lookup(name)
	if err != nil {
		return err
	}
	if e.writer == nil {
		return transport.Errorf(transport.ErrUnsupported, "transport %s cannot write into another runtime's memory", name)
	}
	if tr.pieces != nil && !e.desc.Ranges {
		return transport.Errorf(transport.ErrUnsupported, "transport %s cannot write byte ranges or a subset of an object's tensors", name)
	}
	peerInfo, err := tr.peerOffering(name)
	if err != nil {
		return err
	}
	if e.desc.SameHostOnly && !rt.Identity().SameHost(peerInfo) {
		return transport.Errorf(transport.ErrUnsupported, "transport %s works only between processes on the same host; %q is on another host", name, peerInfo.Name)
	}
	x := tr.x
	x.Transport, x.Destination = name, peerInfo
	cmeta, err := e.t.CommunicatorMetadata(x)
	if err != nil {
		return transportError(name, transport.Wrap(err, "communicator metadata"))
	}
	ctx := tr.ownerCtx()
	if ctx.Err() != nil {
		return transport.ContextError(ctx, "asking the owner to admit the write")
	}
	open := control.WriteOpen{Object: desc.ID, TransferID: x.TransferID, Transport: name, Key: desc.WriteKey, Tag: tr.f.write.tag, Pieces: tr.pieces}
	// The owner answers an admitted write with the object's metadata:
	// where an exposed object lies goes only to holders of its key.
	adm, err := tr.peer.OpenWrite(ctx, open)
	if err != nil {
		return transport.Wrap(err, "owner %s refused the write", desc.Owner.Address)
	}
	tr.opened = true
	select {
	case <-tr.f.abortCh:
		return transport.Errorf(transport.ErrAborted, "write aborted")
	default:
	}
	tr.tmeta, tr.cmeta = adm.Meta, cmeta
	req, err := e.writer.Write(x, tr.targets, adm.Meta, cmeta)
	if err != nil {
		return transportError(name, err)
	}
	tr.entry, tr.req = e, req
	return nil
}

// admitWriteLocal admits a runtime's write into an object it exposed
// itself, as a peer's would be; the copy needs no transport.
func (rt *Runtime) admitWriteLocal(tr *transfer) error {
	desc := tr.ref.desc
	open := control.WriteOpen{Object: desc.ID, TransferID: tr.x.TransferID, Key: desc.WriteKey, Tag: tr.f.write.tag, Pieces: tr.pieces}
	if _, err := rt.admit(rt.Identity(), open, nil); err != nil {
		return err
	}
	tr.opened = true
	return nil
}

// writeLocal copies the sources into an object this runtime exposed.
func (tr *transfer) writeLocal() error {
	rt := tr.f.rt
	o := rt.store.object(tr.ref.desc.ID)
	if o == nil {
		return transport.Errorf(transport.ErrClosed, "runtime %s was destroyed", rt.name)
	}
	for i, src := range tr.targets {
		p := tr.x.PieceOf(i, src)
		dst := o.tensors[p.Tensor]
		dst.Data += uintptr(p.Offset)
		dst.Nbytes = p.Length
		if err := tr.copyOne(dst, src); err != nil {
			return err
		}
	}
	return nil
}

// endWrite tells the owner how an admitted write ended, once no byte of it
// can land any more.
func (tr *transfer) endWrite(err error) {
	if !tr.opened {
		return
	}
	tr.opened = false
	end := control.WriteEnd{Object: tr.ref.desc.ID, TransferID: tr.x.TransferID, Err: err}
	if tr.local {
		tr.f.rt.endWrite(tr.f.rt.id, end)
		return
	}
	tr.peer.WriteDone(end)
}

// errWriteAbandoned is a write part's outcome when its bytes landed after
// the write was aborted (by the caller, its deadline or another part's
// failure): the call does not report success, so no owner may either.
var errWriteAbandoned = transport.Errorf(transport.ErrAborted, "the write was aborted before all of it landed")

// finishWrite ends one part of a write. Its owner is told how it ended
// only once every part has (endWrites), so that each notice says what the
// writer's call returns.
func (tr *transfer) finishWrite(err error) {
	if err == nil && isClosed(tr.f.abortCh) && tr.f.result() == nil {
		// Aborted by its caller, yet landed by a transport that could not
		// stop. (Aborted by another part's failure or the deadline, the
		// whole write's outcome is that failure: see endWrites.)
		err = errWriteAbandoned
	}
	if err == nil {
		tr.settle(nil)
		return
	}
	desc := tr.ref.desc
	tr.settle(transport.Wrap(err, "write into ref %d (object %s%s)", tr.index, desc.ID, ownerUnlessNamed(" of ", desc, err)))
	tr.endErr = err // the owner is told the cause, not how the writer names its part
}

// endWrites tells the owner of each part of a write how it ended, once
// every part has: a part whose bytes all landed is reported failed when
// the write as a whole failed (another part, the deadline, an abort), so
// that no owner applies a version its writer was told did not land.
func (f *Fetch) endWrites() {
	if f.write == nil {
		return
	}
	whole := f.result()
	for _, tr := range f.transfers {
		err := tr.endErr
		if err == nil && whole != nil {
			err = transport.Wrap(whole, "the write of which this part landed failed")
		}
		transport.Protect(f.rt.log, "ending a write", func() error {
			tr.reportWrite(err)
			return nil
		})
	}
}

// reportWrite tells the owner how a part of a write ended, counts it and
// drops the part's handle on the object.
func (tr *transfer) reportWrite(err error) {
	defer tr.ref.Release()
	rt := tr.f.rt
	desc := tr.ref.desc
	tr.endWrite(err)
	tname := "no transport yet"
	switch {
	case tr.local:
		tname = "local copy"
	case tr.entry != nil:
		tname = tr.entry.desc.Name
	case tr.x != nil && tr.x.Transport != "":
		tname = tr.x.Transport // refused before the transport started
	}
	if err == nil {
		rt.c.writesCompleted.Add(1)
		rt.c.bytesWritten.Add(tr.nbytes)
		rt.log.Debugf("wrote %d bytes into object %s of %s over %s in %v", tr.nbytes, desc.ID, desc.Owner.Address, tname, time.Since(tr.start))
		return
	}
	rt.c.writesFailed.Add(1)
	level := rt.log.Warnf
	if st := transport.StatusOf(err); st == transport.ErrAborted || (st == transport.ErrTimeout && tr.f.ctx.Err() != nil) {
		level = rt.log.Debugf
	}
	level("write into object %s of %s over %s failed: %v", desc.ID, desc.Owner.Address, tname, err)
}
