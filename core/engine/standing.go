package engine

import (
	"context"
	"sync"

	"github.com/rdt-project/rdt/core/control"
	"github.com/rdt-project/rdt/core/transport"
)

// Standing admissions, the writer's side (the owner's is in exposure.go).
// A prepared write's kept runs do not ask the owner each time: the first
// kept run asks for a standing admission, later runs only start the
// transport and end with a one-way write done carrying their tag. The
// admission stays open until a run fails, the Prepared closes, the runtime
// is destroyed, or the owner withdraws it (a revocation, notices not
// taken); the next run then asks again, and a refusal fails it. An
// admission covers the runs the owner granted (each has its notice
// reserved there); its last run closes it.

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
}

// admissions are a runtime's open standing admissions, found by the
// owner's withdrawals.
type admissions struct {
	mu sync.Mutex
	m  map[admissionKey]*standing
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

// endRun tells the owner how a run ended, once no byte of it can land any
// more: with its tag, keeping the admission open unless the run failed,
// was its last, or the owner withdrew it.
func (p *Prepared) endRun(s *standing, tag uint64, err error) {
	s.mu.Lock()
	s.running = false
	s.runs--
	keep := err == nil && !s.withdrawn && s.runs > 0
	if !keep {
		s.open = false
	}
	s.mu.Unlock()
	if !keep {
		p.rt.adm.remove(s)
	}
	s.peer.WriteDone(control.WriteEnd{Object: s.obj, TransferID: s.key.id, Err: err, Tag: tag, Keep: keep})
}
