package engine

import (
	"context"
	"math/bits"
	"sync"
	"time"

	"github.com/rdt-project/rdt/core/control"
	"github.com/rdt-project/rdt/core/transport"
)

// peerService is a runtime's side of the control plane: what peers may
// ask of it. The endpoint calls it on its connections' goroutines; it
// holds the parts of the runtime the answers read and change.
type peerService struct {
	me    *identity
	log   *transport.Logger
	ctx   context.Context // the runtime's: its end aborts sends and joins
	bg    *sync.WaitGroup // sends and closings, which destroy waits for
	c     *counters
	store *store      // lends objects, leases and metadata
	reg   *Registry   // the transports that send and extract metadata
	grp   *groups     // rank 0's rendezvous
	gate  *writeGate  // writes into exposed objects
	adm   *admissions // this runtime's standing admissions as a writer
}

var _ control.PeerService = (*peerService)(nil)

// Identity implements PeerService.
func (s *peerService) Identity() transport.PeerInfo { return s.me.info() }

// Borrow implements PeerService.
func (s *peerService) Borrow(from transport.PeerInfo, obj transport.ObjectID, token uint64) error {
	return s.store.lendTo(from.RuntimeID, obj, token)
}

// Unborrow implements PeerService.
func (s *peerService) Unborrow(from transport.RuntimeID, obj transport.ObjectID, n uint64) {
	if held, counted := s.store.returnedBy(from, obj, n); counted && n > held {
		s.log.Warnf("peer %s returned %d borrows of object %s but held %d", from, n, obj, held)
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
func (s *peerService) Lease(from transport.RuntimeID, obj transport.ObjectID) (uint64, error) {
	return s.store.leaseForPeer(from, obj)
}

// Metadata implements PeerService.
func (s *peerService) Metadata(from transport.RuntimeID, obj transport.ObjectID, transportName string) ([]byte, error) {
	e, err := s.reg.lookup(transportName)
	if err != nil {
		return nil, err
	}
	o, err := s.store.pin(obj)
	if err != nil {
		return nil, err
	}
	defer s.store.unpin(o)
	if o.write != nil {
		// Its metadata says where it lies (for some transports, lets a peer
		// write there): it goes only with an admitted write (OpenWrite).
		return nil, transport.Errorf(transport.ErrPermissionDenied, "object %s is exposed for writing: its metadata is given only to a write its key admits", obj)
	}
	return o.metadata(e)
}

// Send implements PeerService: the source runtime (not the application)
// runs a two-sided transport's send on its own goroutine.
func (s *peerService) Send(ctx context.Context, from transport.PeerInfo, req control.SendRequest) error {
	e, err := s.reg.lookup(req.Transport)
	if err != nil {
		return err
	}
	t, name := e.t, e.desc.Name
	if e.sender == nil {
		return transport.Errorf(transport.ErrInvalidArgument, "transport %s is one-sided: the source does not send", name)
	}
	o, err := s.store.pin(req.Object)
	if err != nil {
		return err
	}
	tmeta, err := o.metadata(e)
	if err != nil {
		s.store.unpin(o)
		return err
	}
	x := &transport.Transfer{
		Object: req.Object, TransferID: req.TransferID, Transport: name, Role: transport.RoleSource,
		Source: s.me.info(), Destination: from, Pieces: req.Pieces,
	}
	nbytes := o.desc.Nbytes
	if req.Pieces != nil {
		// The destination's pieces are checked against what was put: a
		// peer names ranges, never addresses.
		if nbytes, err = checkSendPieces(e, o.tensors, req.Pieces); err != nil {
			s.store.unpin(o)
			return err
		}
	}
	done := make(chan error, 1)
	s.bg.Add(1)
	go func() {
		defer s.bg.Done()
		defer s.store.unpin(o) // the memory is read until Send returns
		start := time.Now()
		err := e.sender.Send(x, o.tensors, tmeta, req.CMeta)
		if err == nil {
			e.sends.add(nbytes, nil)
			s.c.sendsCompleted.Add(1)
			s.c.bytesSent.Add(nbytes)
			s.log.Debugf("sent object %s to %s over %s: %d bytes in %v", req.Object, from, name, nbytes, time.Since(start))
		} else {
			s.log.Warnf("send of object %s to %s over %s failed: %v", req.Object, from, name, err)
		}
		done <- err
	}()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
	case <-s.ctx.Done():
	}
	if e.desc.CanAbort {
		t.Abort(x, nil)
		<-done
	}
	return transport.Errorf(transport.ErrAborted, "send of object %s over %s was aborted", req.Object, name)
}

// JoinGroup implements PeerService on rank 0.
func (s *peerService) JoinGroup(ctx context.Context, from transport.PeerInfo, req control.GroupJoin) ([]byte, error) {
	return s.grp.join(ctx, from, req)
}

// OpenWrite implements PeerService.
func (s *peerService) OpenWrite(from transport.PeerInfo, req control.WriteOpen) (control.Admission, error) {
	return s.gate.admitWrite(from, req)
}

// WriteDone implements PeerService.
func (s *peerService) WriteDone(from transport.RuntimeID, end control.WriteEnd) {
	s.gate.endWrite(from, end)
}

// WriteRun implements PeerService.
func (s *peerService) WriteRun(from transport.RuntimeID, obj transport.ObjectID, transferID, tag uint64) {
	s.gate.runWrite(from, obj, transferID, tag)
}

// WriteWithdrawn implements PeerService: the owner withdrew a standing
// admission; it closes now, or at the end of its run in progress.
func (s *peerService) WriteWithdrawn(from transport.RuntimeID, obj transport.ObjectID, transferID uint64, err error) {
	st := s.adm.find(admissionKey{owner: from, id: transferID})
	if st == nil || st.obj != obj {
		s.log.Debugf("runtime %s withdrew admission %d into object %s, which is not open here", from, transferID, obj)
		return
	}
	s.log.Debugf("the owner withdrew the standing admission into object %s: %v", obj, err)
	st.mu.Lock()
	st.withdrawn = true // the next run asks again
	st.mu.Unlock()
	// Sent from a goroutine: this runs on the connection's reader, which
	// must not wait for room in its own outbox.
	s.bg.Add(1)
	go func() {
		defer s.bg.Done()
		s.adm.closeIfIdle(st)
	}()
}

// PeerGone implements PeerService: a lost peer's borrows are returned, and
// transports that keep per-peer state (descriptors, pooled connections)
// are told to drop it, so a long-lived runtime fed by short-lived peers
// does not grow.
func (s *peerService) PeerGone(peer transport.PeerInfo) {
	s.gate.writersGone(peer)
	if returned := s.store.peerGone(peer.RuntimeID); returned > 0 {
		s.log.Infof("peer %s is gone: dropped its %d borrows", peer.RuntimeID, returned)
	}
	for _, e := range s.reg.all() {
		if w, ok := e.t.(transport.PeerWatcher); ok {
			w.PeerGone(peer)
		}
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
