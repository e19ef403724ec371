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
	Destinations []Range
	// Tag is handed to the owner with each write's notice (a version, say).
	Tag uint64
}

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
	return FetchOptions{Transport: o.Transport, Sources: o.Destinations, dir: transport.Write, tag: o.Tag}
}

// checkDirection refuses refs the operation cannot use: a fetch reads
// objects that were put, a write writes objects exposed for writing.
func checkDirection(refs []*Ref, dir transport.Direction) error {
	for i, r := range refs {
		switch write := dir == transport.Write; {
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

// admitLocal admits a runtime's write into an object it exposed itself,
// as a peer's would be; the copy needs no transport.
func (tr *transfer) admitLocal() error {
	rt, desc := tr.f.rt, tr.ref.desc
	r := &route{x: transport.Transfer{Object: desc.ID, TransferID: transport.RandomUint64(), Transport: "local copy",
		Role: transport.RoleSource, Direction: transport.Write, Source: rt.Identity(), Destination: rt.Identity(), Pieces: tr.pieces}}
	open := control.WriteOpen{Object: desc.ID, TransferID: r.x.TransferID, Key: desc.WriteKey, Tag: tr.f.tag, Pieces: tr.pieces}
	if _, err := rt.gate.admit(rt.Identity(), open, nil); err != nil {
		return err
	}
	r.admitted, tr.route = true, r
	return nil
}

// writeLocal copies the sources into an object this runtime exposed.
func (tr *transfer) writeLocal() error {
	rt := tr.f.rt
	o := rt.store.object(tr.ref.desc.ID)
	if o == nil {
		return transport.Errorf(transport.ErrClosed, "runtime %s was destroyed", rt.me.name)
	}
	for i, src := range tr.targets {
		p := tr.route.x.PieceOf(i, src)
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
	if !tr.admitted() {
		return
	}
	tr.route.admitted = false
	if tr.held != nil {
		tr.f.rt.adm.endRun(tr.held, tr.f.tag, err)
		return
	}
	end := control.WriteEnd{Object: tr.ref.desc.ID, TransferID: tr.route.x.TransferID, Err: err}
	if tr.local {
		tr.f.rt.gate.endWrite(tr.f.rt.me.id, end)
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
	if f.dir != transport.Write {
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
	tr.endWrite(err)
	tr.count(err)
}
