package engine

import (
	"context"
	"crypto/subtle"
	"sync"

	"github.com/rdt-project/rdt/core/control"
	"github.com/rdt-project/rdt/core/transport"
)

// writeGate is the owner's gate for writes into the objects it exposed
// (the protocol is described in exposure.go): it admits a write (the key,
// the ranges, the transport), records how its writer ended it, tears the
// writes of a writer gone or of a runtime destroyed, and withdraws
// standing admissions when the owner revokes writes. Each object's open
// writes and notices are its exposure's.
type writeGate struct {
	store *store
	reg   *Registry
	log   *transport.Logger
	ctx   context.Context // the runtime's: bounds the withdrawals
	bg    *sync.WaitGroup // the withdrawals' goroutines, which destroy waits for
}

// admitWrite admits a peer's write over a transport of this runtime that
// writes (and, for ranges, serves them), and returns the object's metadata
// for that transport.
func (g *writeGate) admitWrite(writer transport.PeerInfo, req control.WriteOpen) (control.Admission, error) {
	e, err := g.reg.lookup(req.Transport)
	if err != nil {
		return control.Admission{}, err
	}
	if e.writer == nil {
		return control.Admission{}, transport.Errorf(transport.ErrUnsupported, "transport %s cannot write", e.desc.Name)
	}
	if req.Pieces != nil && !e.desc.Ranges {
		return control.Admission{}, transport.Errorf(transport.ErrUnsupported, "transport %s cannot write byte ranges", e.desc.Name)
	}
	return g.admit(writer, req, e)
}

// admit checks a write against the object it writes into (exposed, the
// key, not revoked, the ranges inside it) and records it open, pinning
// the object. With a transport e, it returns the object's metadata for e,
// which is handed out only here: only a holder of the key learns where an
// exposed object lies.
func (g *writeGate) admit(writer transport.PeerInfo, req control.WriteOpen, e *registered) (adm control.Admission, err error) {
	o, err := g.store.pin(req.Object)
	if err != nil {
		return adm, err
	}
	admitted := false
	defer func() {
		if !admitted {
			g.store.unpin(o)
		}
	}()
	if o.write == nil {
		return adm, transport.Errorf(transport.ErrPermissionDenied, "object %s was put, not exposed for writing", req.Object)
	}
	if subtle.ConstantTimeCompare(req.Key[:], o.desc.WriteKey[:]) != 1 {
		g.log.Warnf("refused a write into object %s by %s: wrong write key (a forged or damaged writable ref)", req.Object, writer.RuntimeID)
		return adm, transport.Errorf(transport.ErrPermissionDenied, "the write key does not match object %s: the writable ref is forged or damaged", req.Object)
	}
	nbytes := o.desc.Nbytes
	if req.Pieces != nil {
		if nbytes, err = checkPieces(o.tensors, req.Pieces); err != nil {
			return adm, err
		}
	}
	if e != nil {
		if adm.Meta, err = o.metadata(e); err != nil {
			return adm, err
		}
	}
	// A standing admission's first run is under way as it is granted.
	w := &openWrite{tag: req.Tag, nbytes: nbytes, pieces: transport.MergePieces(req.Pieces), o: o, standing: req.Standing && e != nil, writer: writer}
	w.running = w.standing
	if err := o.write.admit(openKey{writer.RuntimeID, req.TransferID}, w, req.Object); err != nil {
		return adm, err
	}
	admitted = true
	if w.standing {
		adm.Runs = uint64(w.runs)
	}
	return adm, nil
}

// endWrite records a writer's end of an open write (or of one run of a
// standing admission): its notice, the unpin of a closed one, the
// withdrawal of one whose notices filled the queue.
func (g *writeGate) endWrite(writer transport.RuntimeID, end control.WriteEnd) {
	o := g.store.object(end.Object)
	if o == nil || o.write == nil {
		return // destroyed meanwhile, or never ours: nothing is open
	}
	if !o.write.end(openKey{writer, end.TransferID}, end) {
		g.log.Warnf("runtime %s ended write %d into object %s, which is not open", writer, end.TransferID, end.Object)
	}
}

// runWrite records that a run of a standing admission begins, with its
// tag: until the run ends, a torn admission names it.
func (g *writeGate) runWrite(writer transport.RuntimeID, obj transport.ObjectID, id, tag uint64) {
	o := g.store.object(obj)
	if o == nil || o.write == nil {
		return // destroyed meanwhile, or never ours: nothing is open
	}
	if !o.write.run(openKey{writer, id}, tag) {
		g.log.Warnf("runtime %s began a run of admission %d into object %s, which is no standing admission open", writer, id, obj)
	}
}

// writersGone tears every write a lost peer had open.
func (g *writeGate) writersGone(peer transport.PeerInfo) {
	cause := transport.Errorf(transport.ErrPeerUnavailable, "the writer %s went away with the write open: the bytes it covers may be torn", peer)
	g.tearWrites(peer.RuntimeID, cause, "writer "+peer.String()+" is gone")
}

// tearWrites ends with cause the open writes of writer (zero: every one)
// into every object exposed here.
func (g *writeGate) tearWrites(writer transport.RuntimeID, cause error, why string) {
	for _, o := range g.store.exposedObjects() {
		if torn := o.write.tear(writer, cause); torn > 0 {
			g.log.Warnf("%s with %d writes into object %s open: notices say they are torn", why, torn, o.desc.ID)
		}
	}
}

// withdraw tells the writers of standing admissions into o to close them,
// each on its own goroutine: a writer is reached over ep, on the
// connection it made, and one that is gone is torn by PeerGone instead.
func (g *writeGate) withdraw(ep control.Endpoint, o *object, ws []withdrawal, why error) {
	for _, w := range ws {
		g.log.Debugf("withdrawing the standing admission %d of %s into object %s: %v", w.id, w.writer, o.desc.ID, why)
		g.bg.Add(1)
		go func() {
			defer g.bg.Done()
			ctx, cancel := context.WithTimeout(g.ctx, rpcTimeout)
			defer cancel()
			peer, err := ep.Connect(ctx, w.writer.Address)
			if err != nil {
				g.log.Debugf("could not reach writer %s to withdraw its admission: %v", w.writer, err)
				return
			}
			peer.WithdrawWrite(o.desc.ID, w.id, why)
		}()
	}
}
