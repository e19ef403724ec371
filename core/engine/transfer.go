package engine

import (
	"context"
	"errors"
	"slices"
	"strings"
	"time"

	"github.com/rdt-project/rdt/core/control"
	"github.com/rdt-project/rdt/core/transport"
)

// transfer is one ref of a fetch on its way: the start phase (connect to
// the owner, choose the transport, get the metadata, start the transport's
// fetch and the source's send), the run to its end, and the copy of an
// object this runtime owns.
type transfer struct {
	f       *Fetch
	index   int
	ref     *Ref // the fetch's own handle, released when the transfer ends
	targets []transport.Tensor
	pieces  []transport.Piece // a partial fetch's (nil: every tensor, whole)
	nbytes  uint64            // what the targets receive
	stage   *staging          // host buffers for targets the transport cannot land in

	local bool // the fetching runtime owns the object
	empty bool // nothing to move

	// Remote transfers (and a write into an object this runtime exposed,
	// whose route has no transport).
	peer       control.Peer
	route      *route // resolved by begin: a Prepared keeps it
	req        transport.Request
	sendDone   chan error
	sendCancel context.CancelFunc
	aborted    bool
	start      time.Time

	// The start phase's waits for the owner, bounded by rpcTimeout; made
	// on first use, as most starts never wait.
	waitCtx    context.Context
	waitCancel context.CancelFunc
	// The start phase runs on the caller of StartFetch and must not wait
	// on the network: every such wait ends at once with errWouldBlock.
	inline bool
	// Started without waiting for the owner's answer to our borrow (a
	// transport that notices freed objects itself); see ownerRefusal.
	unconfirmed bool
	// A start that failed and waits for complete to end it (startInline).
	failed error
	// A write's own outcome, kept for the end of the whole write
	// (Fetch.endWrites).
	endErr error
	// held: the standing admission a plain write runs under (standing.go).
	held *standing
	// settled: the transfer was counted out of its fetch (settle).
	settled bool
}

// Each phase of a transfer runs protected: a panic in the engine or in a
// transport fails the transfer with ErrInternal, and the transfer still
// ends (its ref released, the fetch counted out), so that the caller's
// wait returns within its deadline instead of hanging, and the process
// lives on.

// stageHook, set by tests only (before the runtime is used), is called at
// each stage of a transfer (at): a test makes it panic there to check that
// the transfer still ends.
type stageHook func(stage string)

// at calls the hook, if any.
func (h stageHook) at(stage string) {
	if h != nil {
		h(stage)
	}
}

func (tr *transfer) protectedBegin() error {
	return transport.Protect(tr.f.rt.log, "starting a transfer", func() error {
		tr.f.rt.panicAt.at("begin")
		return tr.begin()
	})
}

func (tr *transfer) protectedRun() error {
	return transport.Protect(tr.f.rt.log, "running a transfer", func() error {
		tr.f.rt.panicAt.at("run")
		return tr.run()
	})
}

// end is finish, protected: after a panic in it the transfer is settled
// with the panic's error.
func (tr *transfer) end(err error) {
	defer func() {
		if r := recover(); r != nil {
			tr.settle(transport.Panicked(tr.f.rt.log, "ending a transfer", r))
		}
	}()
	tr.f.rt.panicAt.at("finish")
	tr.finish(err)
}

// settle is what ending a transfer must do whatever failed before it,
// once: record the outcome, drop the fetch's handle on the object (a
// write's is dropped with its notice, in endWrites) and count the transfer
// out, which lets the fetch end.
func (tr *transfer) settle(err error) {
	if tr.settled {
		return
	}
	tr.settled = true
	if tr.f.dir == transport.Write {
		tr.endErr = err
	} else {
		tr.ref.Release()
	}
	tr.f.record(err)
	tr.f.remaining.Add(-1)
}

// Causes, made once: formatting them per fetch would cost more than a
// small fetch itself.
var (
	errGetDeadline = transport.Errorf(transport.ErrTimeout, "the get's deadline passed")
	errOwnerSilent = transport.Errorf(transport.ErrTimeout, "the owner did not answer within %v", rpcTimeout)
	errWouldBlock  = transport.Errorf(transport.ErrAborted, "the start would wait on the network")
	// wouldBlock is a context that has ended, with errWouldBlock.
	wouldBlock = func() context.Context {
		ctx, cancel := context.WithCancelCause(context.Background())
		cancel(errWouldBlock)
		return ctx
	}()
)

// ctx is the context of the start phase: the fetch's.
func (tr *transfer) ctx() context.Context {
	if tr.inline {
		return wouldBlock
	}
	return tr.f.ctx
}

// ownerCtx is the context of a wait for the owner in the start phase: the
// fetch's, bounded by rpcTimeout.
func (tr *transfer) ownerCtx() context.Context {
	if tr.inline {
		return wouldBlock
	}
	if tr.waitCtx == nil {
		tr.waitCtx, tr.waitCancel = context.WithTimeoutCause(tr.f.ctx, rpcTimeout, errOwnerSilent)
	}
	return tr.waitCtx
}

// begin is the start phase of a transfer: connect to the owner, resolve a
// route over the first transport that serves it, and start the transport
// (and a two-sided one's send). Every wait in it ends with the fetch's
// context.
func (tr *transfer) begin() error {
	rt := tr.f.rt
	desc := tr.ref.desc
	tr.start = time.Now()
	if tr.nbytes == 0 {
		tr.empty = true
		return nil
	}
	dir := tr.f.dir
	if dir == transport.Write {
		if err := tr.checkWriteDevices(); err != nil {
			return err
		}
	}
	if tr.ref.owned {
		tr.local = true
		if dir == transport.Write {
			return tr.admitLocal()
		}
		return rt.reg.checkLocalCopy(desc, tr.targets, tr.pieces)
	}
	if err := tr.connectOwner(); err != nil {
		return err
	}
	candidates, auto := tr.candidates()
	if len(candidates) == 0 {
		if dir == transport.Write {
			return transport.Errorf(transport.ErrUnsupported, "no transport in this runtime writes %s memory into %s (have: %v)", desc.Tensors[0].Device.Type, tr.peer.Info(), rt.reg.Names())
		}
		return transport.Errorf(transport.ErrUnsupported, "no transport in this runtime is chosen automatically for %s memory from %s (have: %s; name one to use it)%s",
			desc.Tensors[0].Device.Type, tr.peer.Info(), strings.Join(rt.reg.Names(), ", "), rt.reg.whyAllUnavailable())
	}
	var reasons []string
	var first error
	for _, name := range candidates {
		err := tr.beginWith(name)
		if err == nil {
			return nil
		}
		// The automatic choice tries the next transport where this one
		// cannot serve; once an owner admitted a write, its notice will
		// say how this one ended, and no other transport tries it again.
		st := transport.StatusOf(err)
		retry := st == transport.ErrUnsupported || st == transport.ErrPermissionDenied || (st == transport.ErrNotFound && dir == transport.Read)
		if !auto || !retry || tr.admitted() {
			return err
		}
		reasons = append(reasons, err.Error())
		if first == nil {
			first = err
		}
	}
	if dir == transport.Write {
		return first
	}
	return transport.Errorf(transport.ErrUnsupported, "no transport can fetch from %s: %s", tr.peer.Info(), strings.Join(reasons, "; "))
}

// candidates are the transports a transfer tries, in order: the fetch's
// override, else the one the ref names, else (auto) those ordered for the
// object, the direction and the owner.
func (tr *transfer) candidates() (names []string, auto bool) {
	switch desc := tr.ref.desc; {
	case tr.f.override != "":
		return []string{tr.f.override}, false
	case desc.Transport != "":
		return []string{desc.Transport}, false
	default:
		return tr.f.rt.routes.autoCandidates(tr.f.dir, desc, tr.peer.Info()), true
	}
}

// connectOwner connects to the object's owner (tr.peer), checks that it
// is still the owner, and returns the owner's refusal of our borrow if one
// came already.
func (tr *transfer) connectOwner() error {
	rt := tr.f.rt
	// A dial ends by itself (the handshake timeout), so the fetch's
	// context is enough; a cached connection needs none.
	peer, err := rt.routes.connectOwner(tr.ctx(), tr.ref.desc)
	if err != nil {
		return err
	}
	tr.peer = peer
	return rt.store.borrowRefused(tr.ref.desc.ID)
}

// beginWith resolves the transfer's route over transport name and starts
// the transport.
func (tr *transfer) beginWith(name string) error {
	f := tr.f
	q := &routeQuery{dir: f.dir, desc: tr.ref.desc, peer: tr.peer, pieces: tr.pieces, wait: tr.ownerCtx, tag: f.tag}
	var hk heldKey
	if f.dir == transport.Read {
		q.checks = tr.readable
	} else {
		hk = newHeldKey(tr.peer.Info().RuntimeID, q.desc.ID, name, tr.pieces)
		if s := f.rt.adm.takeHeld(hk); s != nil {
			return tr.beginHeld(s)
		}
		q.standing = !f.rt.adm.hasHeld(hk)
	}
	r, err := f.rt.routes.resolve(q, name)
	if r != nil && (err == nil || r.admitted) {
		tr.route = r // an admitted write is owed its outcome
	}
	if r != nil && r.admitted && q.standing {
		tr.hold(r, hk)
	}
	if err != nil {
		return err
	}
	select {
	case <-f.abortCh:
		// Aborted while we asked the owner: start nothing. (A deadline
		// alone does not stop it: a transfer that completes inside the
		// transport's fetch still makes a get with timeout 0 succeed.)
		return transport.Errorf(transport.ErrAborted, "%s aborted", f.dir.Verb())
	default:
	}
	return tr.startOver(r)
}

// hold makes the standing admission the owner granted over r this
// write's, and keeps it for the writes after it.
func (tr *transfer) hold(r *route, hk heldKey) {
	kept := *r
	kept.admitted = false
	kept.x.Pieces = slices.Clone(r.x.Pieces)
	s := &standing{key: admissionKey{owner: hk.owner, id: r.x.TransferID}, obj: r.x.Object, peer: r.peer,
		open: true, running: true, runs: r.runs, hk: hk, route: &kept}
	adm := &tr.f.rt.adm
	adm.add(s)
	adm.hold(s)
	tr.held = s
}

// beginHeld starts the write over the standing admission s holds: it
// announces the run to the owner (no byte may land before), then starts
// the transport over a copy of s's route.
func (tr *transfer) beginHeld(s *standing) error {
	f := tr.f
	r := *s.route
	r.x.TransferID = s.key.id // the owner's servers find the write by its admission
	if err := s.peer.WriteRun(tr.ctx(), s.obj, s.key.id, f.tag); err != nil {
		if errors.Is(err, errWouldBlock) {
			// Nothing sent, or a run announced again by the retry: the
			// owner takes the last announcement.
			f.rt.adm.unrun(s)
			return err
		}
		r.admitted = true
		tr.route, tr.held = &r, s // ends failed: the owner may have heard of the run
		return transport.Wrap(err, "announcing the write to owner %s", tr.ref.desc.Owner.Address)
	}
	r.admitted = true
	tr.route, tr.held = &r, s
	select {
	case <-f.abortCh:
		return transport.Errorf(transport.ErrAborted, "%s aborted", f.dir.Verb())
	default:
	}
	return tr.startOver(&r)
}

// readable is a read's checks once its transport is known: the owner
// counted our borrow (awaitBorrow), and the targets can receive what the
// transport moves (planLanding).
func (tr *transfer) readable(e *registered) error {
	if err := tr.awaitBorrow(e); err != nil {
		return err
	}
	return tr.planLanding(e)
}

// awaitBorrow waits until the owner counted our borrow, unless transport e
// notices a freed object itself: it may read the source's memory as the
// ref describes it, which is sure to be there only once the borrow counts.
func (tr *transfer) awaitBorrow(e *registered) error {
	if e.desc.DetectsFreedObjects {
		tr.unconfirmed = true
		return nil
	}
	return tr.f.rt.store.borrowConfirmed(tr.ownerCtx, tr.ref.desc.ID)
}

// startOver starts the transport over route r (and a two-sided read's
// send on the source) and keeps the request.
func (tr *transfer) startOver(r *route) error {
	rt, name, x := tr.f.rt, r.entry.desc.Name, &r.x
	if r.entry.sender != nil && x.Direction == transport.Read {
		sctx, cancel := context.WithCancel(rt.ctx)
		tr.sendCancel = cancel
		tr.sendDone = make(chan error, 1)
		req := control.SendRequest{Object: x.Object, TransferID: x.TransferID, Transport: name, CMeta: r.cmeta, Pieces: tr.pieces}
		go func() { tr.sendDone <- tr.peer.Send(sctx, req) }()
	}
	req, err := r.start(x, tr.wire())
	if err != nil {
		if tr.sendCancel != nil {
			tr.sendCancel() // the source's send is aborted; no need to wait for it
			tr.sendCancel, tr.sendDone = nil, nil
		}
		return transportError(name, err)
	}
	tr.req = req
	return nil
}

// admitted reports whether an owner admitted the transfer's write and is
// owed its outcome.
func (tr *transfer) admitted() bool { return tr.route != nil && tr.route.admitted }

// run moves the bytes (or waits for the transport to), copies what was
// staged into its targets, and returns the transfer's outcome. When it
// returns, nothing writes into the targets.
func (tr *transfer) run() error {
	err := tr.receive()
	if err == nil && tr.stage != nil {
		err = tr.stage.unload(tr.f.abortCh)
	}
	return err
}

// receive is run's wait for the transport (or its local copy).
func (tr *transfer) receive() error {
	switch {
	case tr.failed != nil:
		return tr.failed
	case tr.empty:
		return nil
	case tr.local && tr.f.dir == transport.Write:
		return tr.writeLocal()
	case tr.local:
		return tr.copyLocal()
	}
	// A panic in the transport's Release or in a Wait made here ends run,
	// which is protected (protectedRun); a Wait on a goroutine of its own
	// is protected there.
	defer tr.req.Release()
	waitc := make(chan error, 1)
	if tr.sendDone == nil && tr.completed() {
		waitc <- tr.req.Wait() // finished already: no goroutine needed
	} else {
		go func() { waitc <- tr.waitRequest() }()
	}

	var cause error
	abortCh, peerDone, sendDone := tr.f.abortCh, tr.peer.Done(), tr.sendDone
	for waitc != nil {
		select {
		case err := <-waitc:
			waitc = nil
			if err == nil && tr.readsUnguarded() && isClosed(tr.peer.Done()) {
				err = transport.Errorf(transport.ErrPeerUnavailable, "the owner %s shut down as the transfer ended: the bytes read may be of freed memory", tr.peer.Info())
			}
			if err == nil {
				if sendDone != nil {
					// The bytes are here; let the source's send finish, then
					// release its context.
					go func() { <-sendDone; tr.sendCancel() }()
				}
				return nil
			}
			if cause == nil {
				cause = transportError(tr.route.entry.desc.Name, err)
			}
		case err := <-sendDone:
			sendDone = nil
			if err != nil {
				if cause == nil {
					cause = transportError(tr.route.entry.desc.Name, transport.Wrap(err, "the source failed to send"))
				}
				tr.abort()
			}
		case <-abortCh:
			abortCh = nil
			if cause == nil {
				cause = transport.Errorf(transport.ErrAborted, "fetch aborted")
			}
			tr.abort()
		case <-peerDone:
			peerDone = nil
			if cause == nil {
				cause = transport.Errorf(transport.ErrPeerUnavailable, "the owner %s went away during the transfer", tr.peer.Info())
			}
			tr.abort()
		}
	}
	if tr.sendCancel != nil {
		tr.sendCancel()
	}
	// The owner's death may fail the transport before the control plane
	// has read its connection's end (on a loaded machine, a while): on this
	// host its process says so, once it exited. A transport's own failure
	// waits a moment for either to say whether the owner went away: its
	// peer's end can reach the transport first (a NIXL agent disconnected
	// while the dying process still closes its files).
	gone := isClosed(tr.peer.Done()) || tr.ownerProcessGone()
	if !gone && cause != nil && transport.StatusOf(cause) == transport.ErrTransport {
		gone = tr.ownerGoneWithin(ownerGoneGrace)
	}
	if gone {
		if st := transport.StatusOf(cause); st != transport.ErrAborted && st != transport.ErrPeerUnavailable {
			cause = transport.Errorf(transport.ErrPeerUnavailable, "the owner %s went away during the transfer: %v", tr.peer.Info(), cause)
		}
	}
	return cause
}

// ownerGoneGrace bounds how long a transport's failure waits to learn
// whether the owner went away (receive).
const ownerGoneGrace = 250 * time.Millisecond

// ownerGoneWithin reports whether, within d, the owner's connection ends
// or (on this host) its process exits; an abort or the transfer's
// deadline ends the wait.
func (tr *transfer) ownerGoneWithin(d time.Duration) bool {
	deadline := time.NewTimer(d)
	defer deadline.Stop()
	poll := time.NewTicker(10 * time.Millisecond)
	defer poll.Stop()
	for {
		select {
		case <-tr.peer.Done():
			return true
		case <-poll.C:
			if tr.ownerProcessGone() {
				return true
			}
		case <-deadline.C:
			return false
		case <-tr.f.abortCh:
			return false
		case <-tr.f.ctx.Done():
			return false
		}
	}
}

// waitRequest waits for the transport's request, protected.
func (tr *transfer) waitRequest() error {
	return transport.ProtectOf(tr.f.rt.log, "waiting for transport", tr.route.entry.desc.Name, tr.req.Wait)
}

// ownerProcessGone reports whether the owner runs on this host and its
// process has exited.
func (tr *transfer) ownerProcessGone() bool {
	info := tr.peer.Info()
	return info.Pid > 0 && tr.f.rt.Identity().SameHost(info) && !transport.ProcessAlive(info.Pid)
}

// readsUnguarded reports whether the transport read the owner's memory
// with nothing to tell it was freed: one-sided, without
// DetectsFreedObjects. The owner frees only after its peers saw its
// connection close (control.KindClosing), so such a read that completed
// while the connection was still open read live memory.
func (tr *transfer) readsUnguarded() bool {
	return tr.route.entry.sender == nil && !tr.route.entry.desc.DetectsFreedObjects
}

func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// completed reports whether the transfer needs no more waiting: nothing to
// move, or a request that finished inside Fetch.
func (tr *transfer) completed() bool {
	if tr.empty || tr.failed != nil {
		return true
	}
	if tr.req == nil || tr.sendDone != nil {
		return false
	}
	c, ok := tr.req.(transport.CompletedRequest)
	return ok && c.Completed()
}

// abort asks the transport to stop the transfer (once), and the source to
// stop sending.
func (tr *transfer) abort() {
	if tr.aborted {
		return
	}
	tr.aborted = true
	if tr.sendCancel != nil {
		tr.sendCancel()
	}
	if e := tr.route.entry; e.desc.CanAbort {
		e.t.Abort(&tr.route.x, tr.req)
	}
}

// finish ends a transfer's part in its fetch or write. A read is counted
// now and drops its handle on the object; a write's part waits for every
// other part before its owner is told (endWrites). It may wait briefly for
// the owner (ownerRefusal): never call it on StartFetch's caller for a
// failure that awaitsOwner.
func (tr *transfer) finish(err error) {
	if tr.stage != nil {
		tr.stage.free()
	}
	if tr.f.dir == transport.Write {
		tr.finishWrite(err)
		return
	}
	if err != nil {
		if refused := tr.ownerRefusal(err); refused != nil {
			err = refused
		}
	}
	tr.count(err)
	if err != nil {
		err = transport.Wrap(err, "fetch of ref %d (object %s%s)", tr.index, tr.ref.desc.ID, ownerUnlessNamed(" from ", tr.ref.desc, err))
	}
	tr.settle(err)
}

// count counts and logs how a transfer ended, reads and writes alike.
func (tr *transfer) count(err error) {
	rt, desc, dir := tr.f.rt, tr.ref.desc, tr.f.dir
	var moved *registered // the transport that started moving it, if any
	if tr.req != nil {
		moved = tr.route.entry
	}
	rt.c.account(dir, moved, tr.nbytes, time.Since(tr.f.start), err)
	over := "no transport yet"
	switch {
	case tr.local:
		over = "local copy"
	case tr.route != nil:
		over = tr.route.x.Transport
	}
	if err == nil {
		if dir == transport.Write {
			rt.log.Debugf("wrote %d bytes into object %s of %s over %s in %v", tr.nbytes, desc.ID, desc.Owner.Address, over, time.Since(tr.start))
		} else {
			rt.log.Debugf("fetched object %s (%d bytes) from %s over %s in %v", desc.ID, tr.nbytes, desc.Owner.Address, over, time.Since(tr.start))
		}
		return
	}
	level := rt.log.Warnf
	if st := transport.StatusOf(err); st == transport.ErrAborted || (st == transport.ErrTimeout && tr.f.ctx.Err() != nil) {
		level = rt.log.Debugf // asked for: an abort, or the caller's deadline
	}
	if dir == transport.Write {
		level("write into object %s of %s over %s failed: %v", desc.ID, desc.Owner.Address, over, err)
	} else {
		level("fetch of object %s%s over %s failed: %v", desc.ID, ownerUnlessNamed(" from ", desc, err), over, err)
	}
}

// ownerUnlessNamed is prefix and the owner's address for an error message
// about err, or "" when err names the address already: a message names
// the owner once.
func ownerUnlessNamed(prefix string, desc *ObjectDesc, err error) string {
	if strings.Contains(err.Error(), desc.Owner.Address) {
		return ""
	}
	return prefix + desc.Owner.Address
}

// ownerAnswerWait bounds how long a failed transfer waits for the owner's
// answer to our borrow: on a live connection it comes at once.
const ownerAnswerWait = 2 * time.Second

// awaitsOwner reports whether a failure may be explained by the owner's
// answer to our borrow, which can take a round trip (see ownerRefusal).
func (tr *transfer) awaitsOwner(err error) bool {
	return tr.unconfirmed && transport.StatusOf(err) == transport.ErrPeerUnavailable
}

// ownerRefusal is the owner's refusal of our borrow when a transfer started
// before that answer failed with the source looking gone. A transport that
// notices freed objects itself (cma reads a guard the owner clears) sees an
// object freed before our borrow arrived (its lease expired or was revoked)
// as vanished; the owner's answer says what happened: the object was freed
// (NOT_FOUND). The answer is awaited within the fetch's deadline and
// ownerAnswerWait; without one the transport's error stands.
func (tr *transfer) ownerRefusal(err error) error {
	if !tr.awaitsOwner(err) {
		return nil
	}
	if isClosed(tr.peer.Done()) {
		return nil // the owner is gone indeed
	}
	ctx, cancel := context.WithTimeout(tr.f.ctx, ownerAnswerWait)
	defer cancel()
	refused := tr.f.rt.store.borrowConfirmed(func() context.Context { return ctx }, tr.ref.desc.ID)
	if transport.StatusOf(refused) != transport.ErrNotFound {
		return nil
	}
	return refused
}

// deviceSide is the device type of a copy that is not host memory, which
// decides who can copy it: src unless it is host memory.
func deviceSide(src, dst transport.DeviceType) transport.DeviceType {
	if src.HostAccessible() {
		return dst
	}
	return src
}

// localChunk is how much is copied between checks for an abort.
const localChunk = 8 << 20

func (tr *transfer) copyLocal() error {
	rt := tr.f.rt
	o := rt.store.object(tr.ref.desc.ID)
	if o == nil {
		return transport.Errorf(transport.ErrClosed, "runtime %s was destroyed", rt.me.name)
	}
	x := transport.Transfer{Pieces: tr.pieces}
	for i, dst := range tr.targets {
		p := x.PieceOf(i, dst)
		src := o.tensors[p.Tensor]
		src.Data += uintptr(p.Offset)
		src.Nbytes = p.Length
		if err := tr.copyOne(dst, src); err != nil {
			return err
		}
	}
	rt.c.localCopies.Add(1)
	return nil
}

// copyOne copies src into dst within this process: host memory in chunks,
// stopping at an abort between them; other memory with a transport that
// copies it.
func (tr *transfer) copyOne(dst, src transport.Tensor) error {
	if !(src.Device.Type.HostAccessible() && dst.Device.Type.HostAccessible()) {
		copier, name := tr.f.rt.reg.localCopier(deviceSide(src.Device.Type, dst.Device.Type))
		if copier == nil {
			return transport.Errorf(transport.ErrUnsupported, "copying %s memory into %s memory within a process needs a transport that can (none is registered)", src.Device.Type, dst.Device.Type)
		}
		if err := copier.CopyLocal([]transport.Tensor{dst}, []transport.Tensor{src}); err != nil {
			return transportError(name, err)
		}
		return nil
	}
	s, d := transport.Bytes(src.Data, src.Nbytes), transport.Bytes(dst.Data, dst.Nbytes)
	for off := 0; off < len(s); off += localChunk {
		select {
		case <-tr.f.abortCh:
			return transport.Errorf(transport.ErrAborted, "aborted")
		default:
		}
		copy(d[off:], s[off:min(off+localChunk, len(s))])
	}
	return nil
}
