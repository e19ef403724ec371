package engine

import (
	"context"
	"encoding/binary"
	"sync"
	"time"

	"github.com/rdt-project/rdt/core/control"
	"github.com/rdt-project/rdt/core/transport"
)

// Standing admissions, the writer's side (the owner's is in exposure.go).
// A write that finds one open does not ask the owner: it announces its
// run with its tag (a one-way write run, written to the connection before
// the transport starts), moves the bytes and ends with a one-way write
// done carrying the same tag. Prepared writes keep one per kept transfer
// (beginRun); plain writes share one per owner, object, transport and
// ranges (held), which closes after heldIdle without a run. An admission
// stays open until a run fails, its holder closes, the runtime is
// destroyed, or the owner withdraws it (a revocation, notices not taken);
// the next write then asks again, and a refusal fails it. An admission
// covers the runs the owner granted (each has its notice reserved there);
// its last run closes it.

// heldIdle is how long a plain write's standing admission stays open
// without a run: long enough to carry a loop of writes, short enough that
// an owner's object is not held pinned and its notices reserved by a
// writer that has stopped writing.
const heldIdle = 200 * time.Millisecond

// admissionKey names a standing admission: the owner and the id the
// writer gave it.
type admissionKey struct {
	owner transport.RuntimeID
	id    uint64
}

// standing is one standing admission of a prepared write's transfer.
type standing struct {
	key  admissionKey
	obj  transport.ObjectID
	peer control.Peer

	mu        sync.Mutex
	open      bool   // admitted and not closed
	running   bool   // a run of it is in progress
	runs      uint64 // runs it still covers
	withdrawn bool   // the owner asked for it to be closed

	// A plain write's (held): found by hk, started over route (whose
	// template and metadata its writes copy), closed once idle.
	hk    heldKey
	held  bool
	route *route
	idle  *time.Timer
}

// heldKey is what a plain write's standing admission serves: one owner's
// object over one transport, written at the same ranges.
type heldKey struct {
	owner     transport.RuntimeID
	obj       transport.ObjectID
	transport string
	pieces    string // the ranges, encoded ("": every tensor, whole)
}

func newHeldKey(owner transport.RuntimeID, obj transport.ObjectID, name string, pieces []transport.Piece) heldKey {
	k := heldKey{owner: owner, obj: obj, transport: name}
	if pieces != nil {
		b := make([]byte, 0, 1+20*len(pieces))
		b = append(b, 1) // not "": a write of no range is not a whole one
		for _, p := range pieces {
			b = binary.LittleEndian.AppendUint32(b, p.Tensor)
			b = binary.LittleEndian.AppendUint64(b, p.Offset)
			b = binary.LittleEndian.AppendUint64(b, p.Length)
		}
		k.pieces = string(b)
	}
	return k
}

// admissions are a runtime's open standing admissions, found by the
// owner's withdrawals.
type admissions struct {
	mu   sync.Mutex
	m    map[admissionKey]*standing
	held map[heldKey]*standing // plain writes'
}

func (a *admissions) add(s *standing) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.m == nil {
		a.m = map[admissionKey]*standing{}
	}
	a.m[s.key] = s
}

func (a *admissions) remove(s *standing) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.m[s.key] == s {
		delete(a.m, s.key)
	}
	if s.held && a.held[s.hk] == s {
		delete(a.held, s.hk)
	}
}

// hasHeld reports whether a plain write's admission for k is open.
func (a *admissions) hasHeld(k heldKey) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.held[k] != nil
}

// hold keeps s, a plain write's admission just granted, for the writes
// after it, unless another write's is kept already (then s serves its one
// run and closes).
func (a *admissions) hold(s *standing) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.held == nil {
		a.held = map[heldKey]*standing{}
	}
	if a.held[s.hk] == nil {
		a.held[s.hk] = s
		s.held = true
	}
}

// takeHeld marks the admission held for k running and returns it, or nil
// when there is none that can take a run now (busy, withdrawn, used up,
// or its owner's connection gone).
func (a *admissions) takeHeld(k heldKey) *standing {
	a.mu.Lock()
	s := a.held[k]
	a.mu.Unlock()
	if s == nil {
		return nil
	}
	if isClosed(s.peer.Done()) {
		a.remove(s) // the owner tore it when the connection went
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.open || s.running || s.withdrawn || s.runs == 0 {
		return nil
	}
	s.running = true
	return s
}

// unrun undoes takeHeld for a run that did not start (nor announce
// itself in a way the owner could act on): the admission is idle again.
func (a *admissions) unrun(s *standing) {
	s.mu.Lock()
	s.running = false
	s.mu.Unlock()
	a.closeIfWithdrawn(s)
}

// adopt makes s, a plain write's admission, a prepared write's own: no
// plain write takes it any more, nor does it close when idle. false when
// it is not open and idle (closed meanwhile, or another write runs it).
func (a *admissions) adopt(s *standing) bool {
	s.mu.Lock()
	ok := s.open && !s.running && !s.withdrawn
	held := s.held
	if ok {
		s.held, s.route = false, nil
		if s.idle != nil {
			s.idle.Stop()
		}
	}
	s.mu.Unlock()
	if ok && held {
		a.mu.Lock()
		if a.held[s.hk] == s {
			delete(a.held, s.hk)
		}
		a.mu.Unlock()
	}
	return ok
}

// closeHeldOf closes the idle plain-write admissions into obj: its writer
// let go of the object.
func (a *admissions) closeHeldOf(obj transport.ObjectID) {
	a.mu.Lock()
	var of []*standing
	for k, s := range a.held {
		if k.obj == obj {
			of = append(of, s)
		}
	}
	a.mu.Unlock()
	for _, s := range of {
		a.closeIfIdle(s)
	}
}

func (a *admissions) find(k admissionKey) *standing {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.m[k]
}

// closeIdle closes every admission no run uses.
func (a *admissions) closeIdle() {
	a.mu.Lock()
	all := make([]*standing, 0, len(a.m))
	for _, s := range a.m {
		all = append(all, s)
	}
	a.mu.Unlock()
	for _, s := range all {
		a.closeIfIdle(s)
	}
}

// closeIfIdle closes s unless a run of it is in progress (whose end closes
// it when withdrawn).
func (a *admissions) closeIfIdle(s *standing) {
	s.mu.Lock()
	idle := s.open && !s.running
	if idle {
		s.open = false
	}
	s.mu.Unlock()
	if idle {
		a.remove(s)
		s.peer.WriteDone(control.WriteEnd{Object: s.obj, TransferID: s.key.id, Close: true})
	}
}

// closeIfWithdrawn closes s when idle and withdrawn.
func (a *admissions) closeIfWithdrawn(s *standing) {
	s.mu.Lock()
	w := s.withdrawn
	s.mu.Unlock()
	if w {
		a.closeIfIdle(s)
	}
}

// endRun tells the owner how a run ended, once no byte of it can land any
// more: with its tag, keeping the admission open unless the run failed,
// was its last, or the owner withdrew it (a plain write's also when
// another is held). A kept plain-write admission closes after heldIdle
// without a run.
func (a *admissions) endRun(s *standing, tag uint64, err error) {
	s.mu.Lock()
	s.running = false
	s.runs--
	keep := err == nil && !s.withdrawn && s.runs > 0 && (s.held || s.route == nil)
	if !keep {
		s.open = false
	}
	s.mu.Unlock()
	if !keep {
		a.remove(s)
	}
	s.peer.WriteDone(control.WriteEnd{Object: s.obj, TransferID: s.key.id, Err: err, Tag: tag, Keep: keep})
	if keep && s.held {
		if s.idle == nil {
			s.idle = time.AfterFunc(heldIdle, func() { a.closeIfIdle(s) })
		} else {
			s.idle.Reset(heldIdle)
		}
	}
}

// beginRun starts a run of part under its standing admission, asking the
// owner for one (with tag) when it has none open. It returns the
// admission, marked running.
func (p *Prepared) beginRun(ctx context.Context, part *preparedPart, tag uint64) (*standing, error) {
	if s := part.adm; s != nil {
		s.mu.Lock()
		ok := s.open && !s.withdrawn && s.runs > 0
		s.running = ok
		s.mu.Unlock()
		if ok {
			if err := s.peer.WriteRun(ctx, s.obj, s.key.id, tag); err != nil {
				// The owner may have heard of the run: it ends failed.
				p.endRun(s, tag, err)
				return nil, transport.Wrap(err, "announcing the run to owner %s", part.ref.desc.Owner.Address)
			}
			return s, nil
		}
	}
	x, peer := &part.r.x, part.r.peer
	s := &standing{key: admissionKey{owner: peer.Info().RuntimeID, id: transport.RandomUint64()}, obj: x.Object, peer: peer}
	open := control.WriteOpen{Object: x.Object, TransferID: s.key.id, Transport: x.Transport,
		Key: part.ref.desc.WriteKey, Tag: tag, Pieces: x.Pieces, Standing: true}
	adm, err := peer.OpenWrite(ctx, open)
	if err != nil {
		return nil, transport.Wrap(err, "owner %s refused the write", part.ref.desc.Owner.Address)
	}
	s.open, s.running, s.runs = true, true, max(adm.Runs, 1)
	part.adm = s
	p.rt.adm.add(s)
	return s, nil
}

// endRun ends a prepared write's run (admissions.endRun).
func (p *Prepared) endRun(s *standing, tag uint64, err error) { p.rt.adm.endRun(s, tag, err) }
