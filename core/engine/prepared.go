package engine

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/rdt-project/rdt/core/transport"
)

// A prepared transfer is a fetch or a write run again and again with the
// same refs, tensors and options: weight sync every step, KV blocks between
// the same two engines. Its first run is an ordinary Get (or Write), which
// connects to the owners, chooses the transports and gets the metadata;
// the Prepared keeps what each transfer resolved, and later runs only start
// the transports (through their Preparer when they have one) and wait.
//
// What stays checked on every run: the owner's connection (a peer gone
// fails the run with PEER_UNAVAILABLE before anything starts), the
// runtime's life, and whatever the transport checks per start (cma: that
// the owner process lived through the copy and the object's guard still
// holds its token). A write's kept runs share one standing admission
// (standing.go): each run ends with its own tag, so each gets its own
// notice, without a round trip to the owner. The Prepared holds its
// own handles on the refs, so the objects it reads stay borrowed (the
// owner cannot free them) until Close.
//
// Transfers that cannot be kept are run the ordinary way every time: a
// runtime's own objects (a local copy), two-sided transports (a send is
// asked of the source each time) and targets staged through host memory.

// Prepared is a fetch or a write resolved once and run many times. Runs
// are serialized; Close ends it.
type Prepared struct {
	rt      *Runtime
	refs    []*Ref // the Prepared's own handles
	tensors []transport.Tensor
	opts    FetchOptions

	mu     sync.Mutex
	closed bool
	nextID uint64          // the kept transfers' ids: random, then counting
	parts  []*preparedPart // nil until a first run kept them (or when it cannot)
	// kept says the first run's transfers are kept: later runs take the
	// fast path.
	kept bool
}

// preparedPart is one ref's transfer as the first run resolved it: its
// route, kept.
type preparedPart struct {
	ref     *Ref
	r       *route             // its template takes a new TransferID each run
	local   []transport.Tensor // what the transport moves into or from
	nbytes  uint64
	started transport.Prepared // from the transport's Preparer, or nil
	adm     *standing          // a write's standing admission, once a kept run asked
}

// PrepareFetch prepares a fetch of refs into targets (see Get for the
// arguments). Nothing moves until Run.
func (rt *Runtime) PrepareFetch(refs []*Ref, targets []transport.Tensor, opts FetchOptions) (*Prepared, error) {
	if rt.ctx.Err() != nil {
		return nil, transport.Errorf(transport.ErrClosed, "runtime %s was destroyed", rt.me.name)
	}
	if _, err := checkFetchArgs(rt, refs, targets, opts); err != nil {
		return nil, err
	}
	p := &Prepared{rt: rt, tensors: append([]transport.Tensor(nil), targets...), opts: opts}
	if opts.Sources != nil {
		p.opts.Sources = append([]Range(nil), opts.Sources...)
	}
	for i, r := range refs {
		c, err := r.Clone()
		if err != nil {
			p.releaseRefs()
			return nil, transport.Wrap(err, "ref %d", i)
		}
		p.refs = append(p.refs, c)
	}
	return p, nil
}

// PrepareWrite prepares a write of sources into writable refs (see Write),
// as PrepareFetch with the write's options. The tag of each run is given to
// Run.
func (rt *Runtime) PrepareWrite(refs []*Ref, sources []transport.Tensor, opts WriteOptions) (*Prepared, error) {
	return rt.PrepareFetch(refs, sources, opts.fetchOptions())
}

// Write reports whether the Prepared writes (else it fetches).
func (p *Prepared) Write() bool { return p.opts.dir == transport.Write }

// Run runs the transfer once, under timeout (negative: none), and returns
// its outcome as Get or Write would. tag is the write's tag (ignored by a
// fetch). After an error nothing moves any more, as after Get.
func (p *Prepared) Run(tag uint64, timeout time.Duration) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return transport.Errorf(transport.ErrClosed, "the prepared transfer was closed")
	}
	if p.rt.ctx.Err() != nil {
		return transport.Errorf(transport.ErrClosed, "runtime %s was destroyed", p.rt.me.name)
	}
	if timeout == 0 {
		if err := noTimeForPeers(p.refs, p.opts.dir); err != nil {
			return err
		}
		timeout = -1 // this runtime's own objects: copies that wait for no one
	}
	if !p.kept {
		return p.runFull(tag, timeout)
	}
	return p.runKept(tag, timeout)
}

// runFull is an ordinary Get or Write; the first one that succeeds keeps
// its transfers when all of them can be kept.
func (p *Prepared) runFull(tag uint64, timeout time.Duration) error {
	opts := p.opts
	opts.tag = tag
	var ended func(*Fetch)
	if p.parts == nil { // no run succeeded yet: the first that does is kept
		ended = p.keep
	}
	return p.rt.get(p.refs, p.tensors, opts, timeout, ended)
}

// keep takes the transfers of a successful run, if every one of them can
// be started again without its start phase.
func (p *Prepared) keep(f *Fetch) {
	var parts []*preparedPart
	for _, tr := range f.transfers {
		if tr.empty {
			continue
		}
		if tr.local || tr.stage != nil || tr.req == nil || tr.route.entry.sender != nil {
			p.parts = []*preparedPart{} // runs the ordinary way from now on
			return
		}
		parts = append(parts, &preparedPart{ref: p.refs[tr.index], r: tr.route, local: tr.wire(), nbytes: tr.nbytes, adm: tr.held})
	}
	for _, part := range parts {
		if part.adm != nil && !p.rt.adm.adopt(part.adm) {
			part.adm = nil // the next run asks for its own
		}
		r := part.r
		if pr, ok := r.entry.t.(transport.Preparer); ok {
			started, err := pr.Prepare(&r.x, part.local, r.tmeta, r.cmeta)
			if err != nil {
				// The transport's own start will say the same, each run.
				p.rt.log.Debugf("transport %s could not prepare a transfer of object %s: %v", r.entry.desc.Name, r.x.Object, err)
				continue
			}
			part.started = started
		}
	}
	p.parts, p.kept = parts, true
	p.nextID = transport.RandomUint64()
}

// runKept starts every kept transfer (a write under its standing
// admission), waits for them under the deadline, and ends each.
func (p *Prepared) runKept(tag uint64, timeout time.Duration) error {
	k := &keptRun{p: p, tag: tag, start: time.Now(), timeout: timeout, cancel: func() {}}
	defer k.cancel()
	k.startAll()
	k.waitAll()
	k.endAll()
	return k.err
}

// keptRun is one run of a Prepared's kept routes: started in order, waited
// on together and ended together, under one deadline.
type keptRun struct {
	p       *Prepared
	tag     uint64
	start   time.Time
	timeout time.Duration
	// The deadline's context (and its timer) is made only when something
	// waits on it: a small copy done at its start needs none.
	ctx    context.Context
	cancel context.CancelFunc
	runs   []keptTransfer
	err    error // the run's outcome: the first failure
}

// keptTransfer is one started transfer of a kept run.
type keptTransfer struct {
	part *preparedPart
	x    *transport.Transfer
	req  transport.Request
	adm  *standing // a write's admission, ended with the run
	err  error
}

func (k *keptRun) deadline() context.Context {
	if k.ctx == nil {
		rt := k.p.rt
		k.ctx = rt.ctx
		if k.timeout >= 0 {
			k.ctx, k.cancel = context.WithDeadlineCause(rt.ctx, k.start.Add(k.timeout), errGetDeadline)
		}
	}
	return k.ctx
}

// fail keeps the run's first failure, naming the ref of part i.
func (k *keptRun) fail(i int, err error) {
	if k.err == nil {
		part := k.p.parts[i]
		what := "fetch"
		if k.p.opts.dir == transport.Write {
			what = "write into"
		}
		k.err = transport.Wrap(err, "%s of ref %d (object %s from %s)", what, i, part.r.x.Object, part.ref.desc.Owner.Address)
	}
}

// startAll starts the kept transfers in order, up to the first that
// cannot start; that one is ended and counted here.
func (k *keptRun) startAll() {
	p := k.p
	for i, part := range p.parts {
		if peer := part.r.peer; isClosed(peer.Done()) {
			k.fail(i, transport.Errorf(transport.ErrPeerUnavailable, "the owner %s is gone", peer.Info()))
			return
		}
		x := part.r.x
		p.nextID++
		x.TransferID = p.nextID
		t := keptTransfer{part: part, x: &x}
		if x.Direction == transport.Write {
			adm, err := p.beginRun(k.deadline(), part, k.tag)
			if err != nil {
				p.rt.c.account(x.Direction, part.r.entry, part.nbytes, 0, err)
				k.fail(i, err)
				return
			}
			// The owner's servers (tcp's) find the write by its admission.
			t.adm, x.TransferID = adm, adm.key.id
		}
		err := transport.ProtectOf(p.rt.log, "starting a prepared transfer over", part.r.entry.desc.Name, func() (err error) {
			if part.started != nil {
				t.req, err = part.started.Start(t.x)
			} else {
				t.req, err = part.r.start(t.x, part.local)
			}
			return err
		})
		if err != nil {
			t.err = err
			k.end(&t)
			k.fail(i, err)
			return
		}
		k.runs = append(k.runs, t)
	}
}

// waitAll waits for every started request (those started before a
// failure too: nothing may move once Run returns).
func (k *keptRun) waitAll() {
	for i := range k.runs {
		t := &k.runs[i]
		name := t.part.r.entry.desc.Name
		t.err = k.wait(t)
		released := transport.ProtectOf(k.p.rt.log, "releasing a request of transport", name, func() error {
			t.req.Release()
			return nil
		})
		if t.err == nil {
			t.err = released
		}
		if t.err != nil {
			k.fail(k.p.indexOf(t.part), t.err)
		}
	}
}

// endAll ends each started transfer: one whose bytes landed is reported
// failed to its owner when the run as a whole failed, so that every
// owner's notice says what Run returns.
func (k *keptRun) endAll() {
	for i := range k.runs {
		t := &k.runs[i]
		if t.err == nil && k.err != nil {
			t.err = transport.Wrap(k.err, "the write of which this part landed failed")
		}
		k.end(t)
	}
}

// end tells a write's owner how the transfer ended and counts it.
func (k *keptRun) end(t *keptTransfer) {
	if t.adm != nil {
		k.p.endRun(t.adm, k.tag, t.err)
	}
	took := time.Duration(0)
	if t.req != nil {
		took = time.Since(k.start)
	}
	k.p.rt.c.account(t.x.Direction, t.part.r.entry, t.part.nbytes, took, t.err)
}

// wait waits for req under ctx; at the deadline it aborts the request and
// waits until it has stopped.
func (k *keptRun) wait(t *keptTransfer) error {
	part, x, req := t.part, t.x, t.req
	wait := func() error {
		return transport.ProtectOf(k.p.rt.log, "waiting for transport", part.r.entry.desc.Name, req.Wait)
	}
	if c, ok := req.(transport.CompletedRequest); ok && c.Completed() {
		return wait()
	}
	ctx := k.deadline()
	done := make(chan error, 1)
	go func() { done <- wait() }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
	}
	if e := part.r.entry; e.desc.CanAbort {
		e.t.Abort(x, req)
	}
	err := <-done
	if errors.Is(context.Cause(ctx), errGetDeadline) {
		return transport.Errorf(transport.ErrTimeout, "the prepared transfer did not complete within its deadline")
	}
	if err == nil {
		err = transport.Errorf(transport.ErrClosed, "runtime %s was destroyed", k.p.rt.me.name)
	}
	return err
}

func (p *Prepared) indexOf(part *preparedPart) int {
	for i, q := range p.parts {
		if q == part {
			return i
		}
	}
	return -1
}

// Kept reports whether runs after the first take the fast path (every
// transfer kept), for tests and stats.
func (p *Prepared) Kept() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.kept
}

// Close ends the Prepared: it waits for a run in progress, closes what the
// transports prepared and releases its handles on the refs. Later runs
// fail with CLOSED.
func (p *Prepared) Close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return
	}
	p.closed = true
	for _, part := range p.parts {
		if part.started != nil {
			part.started.Close()
		}
		if part.adm != nil {
			p.rt.adm.closeIfIdle(part.adm)
		}
	}
	p.parts = nil
	p.releaseRefs()
}

func (p *Prepared) releaseRefs() {
	for _, r := range p.refs {
		_ = r.Release()
	}
	p.refs = nil
}
