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
		p.opts.Sources = append([]Source(nil), opts.Sources...)
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
		parts = append(parts, &preparedPart{ref: p.refs[tr.index], r: tr.route, local: tr.wire(), nbytes: tr.nbytes})
	}
	for _, part := range parts {
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
	rt := p.rt
	start := time.Now()
	// The deadline's context (and its timer) is made only when something
	// waits on it: a small copy done at its start needs none.
	var ctx context.Context
	cancel := func() {}
	runCtx := func() context.Context {
		if ctx == nil {
			ctx = rt.ctx
			if timeout >= 0 {
				ctx, cancel = context.WithDeadlineCause(rt.ctx, start.Add(timeout), errGetDeadline)
			}
		}
		return ctx
	}
	defer func() { cancel() }()
	write := p.opts.dir == transport.Write
	type running struct {
		part *preparedPart
		x    *transport.Transfer
		req  transport.Request
		adm  *standing // a write's admission, ended with the run
	}
	runs := make([]running, 0, len(p.parts))
	var firstErr error
	what := "fetch"
	if write {
		what = "write into"
	}
	fail := func(i int, err error) {
		if firstErr == nil {
			firstErr = transport.Wrap(err, "%s of ref %d (object %s from %s)", what, i, p.parts[i].r.x.Object, p.parts[i].ref.desc.Owner.Address)
		}
	}
	for i, part := range p.parts {
		if peer := part.r.peer; isClosed(peer.Done()) {
			fail(i, transport.Errorf(transport.ErrPeerUnavailable, "the owner %s is gone", peer.Info()))
			break
		}
		x := part.r.x
		p.nextID++
		x.TransferID = p.nextID
		r := running{part: part, x: &x}
		if write {
			adm, err := p.beginRun(runCtx(), part, tag)
			if err != nil {
				rt.c.account(p.opts.dir, part.r.entry, part.nbytes, 0, err)
				fail(i, err)
				break
			}
			// The owner's servers (tcp's) find the write by its admission.
			r.adm, x.TransferID = adm, adm.key.id
		}
		err := transport.ProtectOf(rt.log, "starting a prepared transfer over", part.r.entry.desc.Name, func() (err error) {
			if part.started != nil {
				r.req, err = part.started.Start(r.x)
			} else {
				r.req, err = part.r.start(r.x, part.local)
			}
			return err
		})
		if err != nil {
			if r.adm != nil {
				p.endRun(r.adm, tag, err)
			}
			rt.c.account(p.opts.dir, part.r.entry, part.nbytes, 0, err)
			fail(i, err)
			break
		}
		runs = append(runs, r)
	}
	// Wait for every started request (those started before a failure
	// too: nothing may move once Run returns).
	errs := make([]error, len(runs))
	for k, r := range runs {
		errs[k] = p.wait(runCtx, r.part, r.x, r.req)
		released := transport.ProtectOf(rt.log, "releasing a request of transport", r.part.r.entry.desc.Name, func() error {
			r.req.Release()
			return nil
		})
		if errs[k] == nil {
			errs[k] = released
		}
		if errs[k] != nil {
			fail(p.indexOf(r.part), errs[k])
		}
	}
	// Then end each: a run whose bytes landed is reported failed to its
	// owner when the run as a whole failed, so that every owner's notice
	// says what Run returns.
	for k, r := range runs {
		err := errs[k]
		if err == nil && firstErr != nil {
			err = transport.Wrap(firstErr, "the write of which this part landed failed")
		}
		if r.adm != nil {
			p.endRun(r.adm, tag, err)
		}
		rt.c.account(p.opts.dir, r.part.r.entry, r.part.nbytes, time.Since(start), err)
	}
	return firstErr
}

// wait waits for req under ctx; at the deadline it aborts the request and
// waits until it has stopped.
func (p *Prepared) wait(runCtx func() context.Context, part *preparedPart, x *transport.Transfer, req transport.Request) error {
	wait := func() error {
		return transport.ProtectOf(p.rt.log, "waiting for transport", part.r.entry.desc.Name, req.Wait)
	}
	if c, ok := req.(transport.CompletedRequest); ok && c.Completed() {
		return wait()
	}
	ctx := runCtx()
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
		err = transport.Errorf(transport.ErrClosed, "runtime %s was destroyed", p.rt.me.name)
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
