package nixl

/*
#include <stdlib.h>
#include "shim.h"
*/
import "C"

import (
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/rdt-project/rdt/core/transport"
)

func (t *Transport) CommunicatorMetadata(x *transport.Transfer) ([]byte, error) { return nil, nil }

// Fetch registers the targets and posts READs of what each receives (its
// piece, or its tensor whole) from the source agent: small transfers at
// once, larger ones chunk by chunk on a goroutine.
func (t *Transport) Fetch(x *transport.Transfer, targets []transport.Tensor, tmeta, cmeta []byte) (transport.Request, error) {
	return t.start(x, targets, tmeta)
}

// start is Fetch and Write: it moves, the way x.Direction says, between
// local (the targets of a read, the sources of a write) and the remote
// object tmeta describes.
func (t *Transport) start(x *transport.Transfer, local []transport.Tensor, tmeta []byte) (transport.Request, error) {
	pl, err := t.plan(x, local, tmeta)
	if err != nil {
		return nil, err
	}
	return t.launch(pl, nil)
}

// planned is a transfer checked and cut into chunks, with the agent that
// runs it.
type planned struct {
	agent   unsafe.Pointer
	dir     transport.Direction
	m       *metadata
	chunks  []chunk
	regions []regKey // the local memory to register
	total   uint64
}

// plan checks a transfer against the metadata and the local tensors and
// cuts it into chunks.
func (t *Transport) plan(x *transport.Transfer, local []transport.Tensor, tmeta []byte) (*planned, error) {
	m, err := decodeMetadata(tmeta)
	if err != nil {
		return nil, err
	}
	if err := x.CheckPieces(local, len(m.Regions), func(i int) uint64 { return m.Regions[i].Size }); err != nil {
		return nil, err
	}
	for i, tg := range local {
		if !tg.Device.Type.HostAccessible() && !slices.Contains(t.devices, tg.Device.Type) {
			return nil, transport.Errorf(transport.ErrUnsupported, "%s %d is in %s memory, which this transport does not move in this process", localName(x.Direction), i, tg.Device)
		}
	}
	chunks, regions, total, err := plan(x, m, local)
	if err != nil {
		return nil, err
	}
	agent, err := t.ensureAgent()
	if err != nil {
		return nil, err
	}
	return &planned{agent: agent, dir: x.Direction, m: m, chunks: chunks, regions: regions, total: total}, nil
}

// localName is what the local tensors of a transfer are, for errors.
func localName(dir transport.Direction) string {
	if dir == transport.Write {
		return "source"
	}
	return "target"
}

// registerLocal registers the local memory of pl with its agent, one list per
// memory type; the caller deregisters them (deregister).
func (t *Transport) registerLocal(pl *planned) ([]unsafe.Pointer, error) {
	var locals []unsafe.Pointer
	for _, mem := range []uint8{memDRAM, memVRAM} {
		these := ofMemory(pl.regions, mem)
		if len(these) == 0 {
			continue
		}
		d, err := dlist(these)
		if err == nil {
			var call *C.char
			if st := C.rdtnx_register(pl.agent, d, &call); st != C.RDTNX_SUCCESS {
				C.rdtnx_dlist_free(d)
				err = callError(transport.ErrTransport, "registering the "+localName(pl.dir)+"s", call, st)
			}
		}
		if err != nil {
			t.deregister(pl.agent, locals)
			return nil, err
		}
		locals = append(locals, d)
	}
	return locals, nil
}

// deregister ends and frees registrations register made.
func (t *Transport) deregister(agent unsafe.Pointer, locals []unsafe.Pointer) {
	var call *C.char
	for _, d := range locals {
		if st := C.rdtnx_deregister(agent, d, &call); st != C.RDTNX_SUCCESS {
			t.h.Log().Warnf("%v", callError(transport.ErrTransport, "deregistering the local tensors", call, st))
		}
		C.rdtnx_dlist_free(d)
	}
}

// launch starts pl: with kept registrations (a prepared transfer's), or
// registering its local memory for this request alone (kept nil).
func (t *Transport) launch(pl *planned, kept []unsafe.Pointer) (transport.Request, error) {
	m := pl.m
	req := &request{t: t, agent: pl.agent, dir: pl.dir, started: time.Now(), total: pl.total, chunks: pl.chunks, remoteName: m.Agent,
		postDone: make(chan struct{}), progress: make(chan struct{}, 1)}
	if len(pl.chunks) == 0 {
		close(req.postDone)
		return req, nil
	}
	// A fetch starts all its transfers before it releases any, so the
	// agent may be held by this fetch's own transfers, and waiting for it
	// here would never end: when it is busy, the poster waits for it.
	rem, ok, err := t.acquire(pl.agent, m, true)
	if err != nil {
		return nil, err
	}
	if !ok {
		req.waitAgent = m
	}
	req.rem = rem
	if kept == nil {
		locals, err := t.registerLocal(pl)
		if err != nil {
			close(req.postDone)
			req.Release()
			return nil, err
		}
		req.locals = locals
	}
	if pl.total <= syncLimit && req.waitAgent == nil {
		req.post()
		if req.postErr != nil {
			err := req.postErr
			req.Release()
			return nil, err
		}
		return req, nil
	}
	go req.post()
	return req, nil
}

// Abort makes Wait return ErrAborted at its next poll. The I/O itself
// cannot be cancelled: Release waits for it.
func (t *Transport) Abort(x *transport.Transfer, r transport.Request) {
	if req, ok := r.(*request); ok {
		req.aborted.Store(true)
	}
}

type xfer struct {
	q    unsafe.Pointer
	done bool // the status left in-progress
	st   C.int
	n    uint64 // the bytes it moves
}

type request struct {
	t          *Transport
	agent      unsafe.Pointer
	dir        transport.Direction
	rem        *remote
	remoteName string
	locals     []unsafe.Pointer // this request's own registrations (none with a prepared's)
	chunks     []chunk
	aborted    atomic.Bool
	started    time.Time
	total      uint64 // bytes to read
	once       sync.Once
	// waitAgent: the source agent was busy at Fetch; the poster acquires
	// it (setting rem) before it posts.
	waitAgent *metadata

	// landed counts the bytes of requests polled done; each poll that
	// finds one done sends on progress, which a poster waiting for room in
	// its window reads (see window).
	landed   atomic.Uint64
	progress chan struct{}
	// stopped: a posted request failed, so the transfer has; the poster
	// posts nothing more (Release waits for it to stop).
	stopped atomic.Bool

	mu       sync.Mutex
	xfers    []*xfer // posted so far
	postDone chan struct{}
	postErr  error // set before postDone is closed
	failed   bool
}

// post makes and posts one READ per chunk, stopping at an abort or an
// error. It closes postDone when it stops.
func (r *request) post() {
	defer close(r.postDone)
	if r.waitAgent != nil {
		rem, _, err := r.t.acquire(r.agent, r.waitAgent, false)
		if err != nil {
			r.postErr = err
			return
		}
		r.rem = rem // read by cleanup only after postDone
		if r.aborted.Load() {
			return
		}
	}
	cname := C.CString(r.remoteName)
	defer C.free(unsafe.Pointer(cname))
	var posted uint64
	for _, c := range r.chunks {
		n := c.bytes()
		if !r.roomFor(posted, n) {
			return // aborted
		}
		la, ra := newArrays(len(c.spans)), newArrays(len(c.spans))
		for j, s := range c.spans {
			la.set(j, s.laddr, s.n, s.ldev)
			ra.set(j, s.raddr, s.n, s.rdev)
		}
		var q unsafe.Pointer
		var call *C.char
		st := C.rdtnx_xfer(r.agent, xferOp(r.dir), C.int(c.local), la.addr, la.dev, C.int(c.remote), ra.addr, ra.dev, la.n, la.count, cname, &q, &call)
		la.free()
		ra.free()
		if st != C.RDTNX_SUCCESS && st != C.RDTNX_IN_PROG {
			r.mu.Lock()
			r.failed = true
			r.mu.Unlock()
			r.postErr = callError(transport.ErrTransport, r.verb()+" agent "+r.remoteName, call, st)
			return
		}
		posted += n
		if st == C.RDTNX_SUCCESS {
			r.landed.Add(n)
		}
		r.mu.Lock()
		r.xfers = append(r.xfers, &xfer{q: q, done: st == C.RDTNX_SUCCESS, n: n})
		r.mu.Unlock()
	}
}

// roomFor waits until a chunk of n bytes fits the window beside what is
// posted and not landed (a first chunk always does), and reports false
// if the request was aborted, or a posted request failed, meanwhile. NIXL
// cannot cancel a posted request: the window bounds what an abort still
// waits for.
func (r *request) roomFor(posted, n uint64) bool {
	for {
		if r.aborted.Load() || r.stopped.Load() {
			return false
		}
		inFlight := posted - r.landed.Load()
		if inFlight == 0 || inFlight+n <= r.window() {
			return true
		}
		select { // Wait's polls signal progress; the timer rechecks an abort
		case <-r.progress:
		case <-time.After(windowRecheck):
		}
	}
}

// window is how many bytes may be in flight: what the rate measured so
// far moves in windowTime, between one chunk and maxWindow; before any
// request landed, two chunks.
func (r *request) window() uint64 {
	landed := r.landed.Load()
	elapsed := time.Since(r.started)
	if landed == 0 || elapsed <= 0 {
		return 2 * chunkSize
	}
	w := uint64(float64(landed) / elapsed.Seconds() * windowTime.Seconds())
	return min(max(w, chunkSize), maxWindow)
}

// xferOp is NIXL's operation for a transfer's direction: a READ of the
// owner's memory, or a WRITE into it.
func xferOp(dir transport.Direction) C.int {
	if dir == transport.Write {
		return C.RDTNX_XFER_WRITE
	}
	return C.RDTNX_XFER_READ
}

// verb says what the request does, for errors.
func (r *request) verb() string {
	if r.dir == transport.Write {
		return "writing into"
	}
	return "reading from"
}

// poll checks every posted, unfinished NIXL request once, and reports
// whether everything is done.
func (r *request) poll() (bool, error) {
	posted := false
	select {
	case <-r.postDone:
		posted = true
		if r.postErr != nil {
			return true, r.postErr
		}
	default:
	}
	r.mu.Lock()
	xs := r.xfers
	r.mu.Unlock()
	all := posted
	landed := false
	defer func() {
		if landed {
			select {
			case r.progress <- struct{}{}:
			default:
			}
		}
	}()
	for _, x := range xs {
		if x.done {
			continue
		}
		st := C.rdtnx_status(r.agent, x.q)
		switch {
		case st == C.RDTNX_IN_PROG:
			all = false
		case st == C.RDTNX_SUCCESS:
			x.done, landed = true, true
			r.landed.Add(x.n)
		default:
			x.done, x.st = true, st
			r.mu.Lock()
			r.failed = true
			r.mu.Unlock()
			r.stopped.Store(true) // the poster posts nothing more
			landed = true         // wakes a poster waiting for room, to see it
			return true, transport.Errorf(transport.ErrTransport, "%s agent %s failed: nixl_capi_get_xfer_status returned %d (%s)", r.verb(), r.remoteName, int(st), statusName(st))
		}
	}
	return all, nil
}

// Completed lets the engine skip a goroutine for transfers done in Fetch.
func (r *request) Completed() bool {
	done, err := r.poll()
	return done || err != nil
}

// Wait polls until every chunk was read, one failed, or the request was
// aborted. It spins briefly, then sleeps with a growing interval.
func (r *request) Wait() error {
	// Until the copy should be about done, polls only yield; sleeping then
	// would add a timer's wake-up to a transfer that is about to finish.
	spinUntil := r.started.Add(min(time.Duration(r.total/copyBytesPerMicrosecond)*time.Microsecond, maxSpin))
	for i := 0; ; i++ {
		if r.aborted.Load() {
			return transport.Errorf(transport.ErrAborted, "transfer aborted")
		}
		done, err := r.poll()
		if err != nil {
			return err
		}
		if done {
			return nil
		}
		if time.Now().Before(spinUntil) {
			i = 0
			runtime.Gosched()
			continue
		}
		pause(i)
	}
}

func pause(i int) {
	switch {
	case i < 64:
		runtime.Gosched()
	case i < 256:
		time.Sleep(20 * time.Microsecond)
	default:
		time.Sleep(200 * time.Microsecond)
	}
}

// Release waits until NIXL no longer works on any read (an aborted one
// included), then releases the requests and the target registrations.
func (r *request) Release() { r.once.Do(r.cleanup) }

func (r *request) cleanup() {
	<-r.postDone // the poster may be inside a synchronous post
	var call *C.char
	for _, x := range r.xfers {
		warned := false
		for i := 0; !x.done; i++ {
			st := C.rdtnx_status(r.agent, x.q)
			if st != C.RDTNX_IN_PROG {
				x.done, x.st = true, st
				if st < 0 {
					r.failed = true
				}
				break
			}
			if !warned && i > 0 && i%5000 == 0 {
				warned = true
				r.t.h.Log().Warnf("a read from agent %s is still in flight after %v; NIXL cannot cancel it, waiting", r.remoteName, time.Since(r.started).Round(time.Millisecond))
			}
			pause(i)
		}
		if st := C.rdtnx_release(r.agent, x.q, &call); st != C.RDTNX_SUCCESS {
			r.t.h.Log().Warnf("%v", callError(transport.ErrTransport, "releasing a request", call, st))
		}
	}
	r.xfers = nil
	r.t.deregister(r.agent, r.locals)
	r.locals = nil
	if r.rem != nil {
		if r.failed {
			r.rem.stale.Store(true) // NIXL may have dropped the agent
		}
		r.rem.mu.RUnlock()
		r.rem = nil
	}
}

const (
	// chunkSize bounds one NIXL request; between chunks the poster checks
	// for an abort. (UCX's cma transport copies during progress, in
	// 512 KiB steps, not in the post call.)
	chunkSize = 16 << 20
	// At most maxWindow bytes, or what windowTime moves at the rate seen
	// so far (at least a chunk), are posted and not landed: a request
	// aborted at its deadline ends when those land (about windowTime
	// later, or one chunk's time on a slow link), not when everything it
	// would have posted at once would have.
	windowTime    = 100 * time.Millisecond
	maxWindow     = 8 * chunkSize
	windowRecheck = 5 * time.Millisecond
	// syncLimit: transfers up to this size are posted inside Fetch.
	syncLimit = 256 << 10
	// copyBytesPerMicrosecond is a fast single-threaded copy between
	// processes (10 GB/s): Wait does not sleep before the transfer could
	// be done at that speed, nor after maxSpin.
	copyBytesPerMicrosecond = 10_000
	maxSpin                 = 2 * time.Millisecond
)

// Prepare implements transport.Preparer: the checks, the plan and the
// registration of the local tensors are done once, so that each Start
// only creates and posts the NIXL requests (registering memory costs more
// than moving a small transfer). The remote agent is still acquired per
// Start, so that a peer gone in between is invalidated as for any fetch.
func (t *Transport) Prepare(x *transport.Transfer, local []transport.Tensor, tmeta, cmeta []byte) (transport.Prepared, error) {
	pl, err := t.plan(x, local, tmeta)
	if err != nil {
		return nil, err
	}
	locals, err := t.registerLocal(pl)
	if err != nil {
		return nil, err
	}
	return &prepared{t: t, pl: pl, locals: locals}, nil
}

// prepared is a transfer Prepare planned and registered.
type prepared struct {
	t      *Transport
	pl     *planned
	locals []unsafe.Pointer
}

func (p *prepared) Start(x *transport.Transfer) (transport.Request, error) {
	return p.t.launch(p.pl, p.locals)
}

func (p *prepared) Close() {
	p.t.deregister(p.pl.agent, p.locals)
	p.locals = nil
}
