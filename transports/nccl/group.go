package nccl

import (
	"context"
	"sort"
	"sync"
	"time"

	"github.com/rdt-project/rdt/core/transport"
	"github.com/rdt-project/rdt/transports/internal/cuda"
)

// lane is one of a group's two communicators, with its stream. NCCL runs
// the operations of a communicator one after another, and a receive holds
// that queue until its data arrives. With one communicator, two ranks that
// fetch from each other at once could each enqueue their receive before
// their send, and wait forever (whatever the size) for a send queued
// behind the other's receive. So transfers to higher ranks go over lane 0
// and transfers to lower ranks over lane 1: a rank's receives from one
// side never hold up its sends to the other.
type lane struct {
	comm   *Comm
	stream *cuda.Stream
	// enq is held from an enqueue until NCCL has put the work on the
	// stream: a communicator takes one call at a time, and none while an
	// earlier one is in progress.
	enq sync.Mutex
}

// numLanes is the number of communicators of a group.
const numLanes = 2

// group is this rank's part of one group.
type group struct {
	t      *Transport
	roster *transport.GroupRoster
	name   string
	rank   int
	dev    int
	lanes  [numLanes]*lane

	// mu is held for reading around every NCCL call but the teardown's,
	// which starts only after aborted or freed is set under it: so no
	// other call is ever inside NCCL during ncclCommAbort.
	mu         sync.RWMutex
	dead       error
	deadCh     chan struct{}
	aborted    bool           // the teardown aborts the communicators
	freed      bool           // the teardown destroys them
	active     sync.WaitGroup // transfers whose NCCL work is enqueued (or being enqueued)
	changed    chan struct{}  // closed and replaced when an order advances
	recvAssign map[int]uint64 // destination: next sequence number per source rank
	recvNext   map[int]uint64 // destination: next to enqueue per source rank
	sendNext   map[int]uint64 // source: next to enqueue per destination rank

	// scratch is the connection's device memory, kept until the
	// teardown: cuMemFree synchronizes the whole device, so freeing it
	// after connecting would wait for every other group's work there.
	scratch cuda.Ptr

	tearOnce sync.Once
	torn     chan struct{} // closed once NCCL has freed the communicators
	tornErr  error         // the teardown's first error, set before torn closes
}

func newGroup(t *Transport, r *transport.GroupRoster, spec transport.GroupSpec) *group {
	return &group{t: t, roster: r, name: r.Name, rank: spec.Rank, dev: spec.Device,
		deadCh: make(chan struct{}), changed: make(chan struct{}), torn: make(chan struct{}),
		recvAssign: map[int]uint64{}, recvNext: map[int]uint64{}, sendNext: map[int]uint64{}}
}

// laneOf is the lane of the transfers from rank src to rank dst.
func (g *group) laneOf(src, dst int) *lane {
	if src < dst {
		return g.lanes[0]
	}
	return g.lanes[1]
}

// NewGroupBootstrap implements transport.GroupBackend on rank 0: an
// ncclGetUniqueId for each lane.
func (t *Transport) NewGroupBootstrap(spec transport.GroupSpec) ([]byte, error) {
	if err := checkDevice(spec.Device); err != nil {
		return nil, err
	}
	var boot []byte
	for range numLanes {
		id, err := NewUniqueID()
		if err != nil {
			return nil, err
		}
		boot = append(boot, id[:]...)
	}
	return boot, nil
}

func checkDevice(dev int) error {
	n, err := cuda.DeviceCount()
	if err != nil {
		return err
	}
	if dev >= n {
		return transport.Errorf(transport.ErrInvalidArgument, "device %d does not exist (this process sees %d CUDA devices)", dev, n)
	}
	return nil
}

// InitGroup implements transport.GroupBackend: a non-blocking
// communicator per lane on the rank's device, then the connection of every
// pair of ranks, bounded by ctx. On failure, or when ctx ends first, the
// communicators are aborted in the background (NCCL's teardown waits for
// the other ranks on the host, which InitGroup does not).
func (t *Transport) InitGroup(ctx context.Context, r *transport.GroupRoster, spec transport.GroupSpec) error {
	if len(r.Bootstrap) != numLanes*UniqueIDSize {
		return transport.Errorf(transport.ErrCorrupt, "rank 0 sent %d bytes of unique ids, not %d", len(r.Bootstrap), numLanes*UniqueIDSize)
	}
	if err := checkDevice(spec.Device); err != nil {
		return err
	}
	g := newGroup(t, r, spec)
	// Every rank forms the lanes in the same order (forming a communicator
	// is collective).
	for i := range numLanes {
		var id UniqueID
		copy(id[:], r.Bootstrap[i*UniqueIDSize:])
		c, err := InitRank(ctx, spec.Device, r.WorldSize(), spec.Rank, id)
		if c != nil {
			g.lanes[i] = &lane{comm: c}
		}
		if err == nil {
			g.lanes[i].stream, err = cuda.NewStream(spec.Device)
		}
		if err != nil {
			g.abandon(err)
			if ctx.Err() != nil && transport.StatusOf(err) == transport.ErrTimeout {
				return transport.Errorf(transport.ErrTimeout, "NCCL did not form the communicator in time (every rank joined the group; is a rank's NCCL stuck or its process gone?)")
			}
			return err
		}
	}
	if err := g.connect(ctx); err != nil {
		return err
	}
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		g.destroy(transport.Errorf(transport.ErrClosed, "the runtime was destroyed"), false)
		return transport.Errorf(transport.ErrClosed, "the runtime was destroyed")
	}
	old := t.groups[r.Name]
	t.groups[r.Name] = g
	t.mu.Unlock()
	if old != nil { // a group destroyed after a failure, replaced
		old.destroy(transport.Errorf(transport.ErrClosed, "it was replaced"), false)
	}
	t.h.Log().Debugf("group %q: rank %d of %d on cuda:%d (NCCL %s)", r.Name, spec.Rank, r.WorldSize(), spec.Device, VersionString())
	return nil
}

// abandon ends a group that did not form: its communicators are aborted
// in the background.
func (g *group) abandon(cause error) {
	g.mu.Lock()
	if g.dead == nil {
		g.dead = transport.Errorf(transport.StatusOf(cause), "group %q did not form: %v", g.name, cause)
		close(g.deadCh)
	}
	g.aborted = true
	g.mu.Unlock()
	g.startTeardown(true)
}

// connect makes NCCL connect this rank with every other rank, on both
// lanes, before the group is used. NCCL connects two ranks at the first
// send or receive between them, once both have posted theirs. Left to the
// first transfers, ranks fetching from each other around a cycle (0 from
// 1, 1 from 2, 2 from 0) could each wait for its connection holding a
// lane's enqueue lock, while the peer's matching enqueue waits behind the
// next rank's lock: a deadlock until the deadlines abort them all. Every
// rank calls connect, with one group per lane holding a one-byte send or
// receive for every peer, which NCCL connects all at once; lane by lane,
// each finished before the next starts (connecting allocates NCCL's
// buffers, and NCCL warns that work of one communicator may wait for
// another's kernels then). On failure or at ctx's end the group is
// abandoned.
func (g *group) connect(ctx context.Context) error {
	n := g.roster.WorldSize()
	if n == 1 {
		return nil
	}
	scratch, err := cuda.Alloc(g.dev, uint64(n)+1)
	if err != nil {
		g.abandon(err)
		return err
	}
	g.scratch = scratch // freed by the teardown
	ev, err := cuda.NewEvent(g.dev)
	if err != nil {
		g.abandon(err)
		return err
	}
	for i, l := range g.lanes {
		if err := g.connectLane(ctx, l, i == 0, uintptr(scratch), ev); err != nil {
			g.abandon(err)
			// NCCL may record into ev until the abort has stopped it.
			go func() {
				<-g.torn
				g.settle(ev)
				ev.Destroy()
			}()
			return err
		}
	}
	ev.Destroy()
	return nil
}

// connectLane runs one lane's connection and waits for it, bounded by ctx.
func (g *group) connectLane(ctx context.Context, l *lane, up bool, scratch uintptr, ev *cuda.Event) error {
	n := g.roster.WorldSize()
	timeout := transport.Errorf(transport.ErrTimeout, "NCCL did not connect the %d ranks in time (every rank joined the group; is a rank's process gone?)", n)
	busy, err := l.comm.Connect(g.rank, n, up, scratch, l.stream)
	if err == nil && busy {
		if err = l.comm.Await(ctx, nil); err != nil && ctx.Err() != nil {
			return timeout
		}
	}
	if err == nil {
		err = ev.Record(l.stream)
	}
	if err != nil {
		return err
	}
	for delay := 5 * time.Microsecond; ; delay = min(delay*2, time.Millisecond) {
		done, err := ev.Query()
		if err == nil {
			err = l.comm.AsyncError()
		}
		if err != nil {
			return err
		}
		if done {
			return nil
		}
		select {
		case <-ctx.Done():
			return timeout
		case <-time.After(delay):
		}
	}
}

// DestroyGroup implements transport.GroupBackend: ncclCommDestroy (or
// nothing more if a failure already aborted it), waiting for NCCL to free
// the communicators at most RDT_NCCL_TEARDOWN_MS.
func (t *Transport) DestroyGroup(name string) error {
	t.mu.Lock()
	g := t.groups[name]
	delete(t.groups, name)
	t.mu.Unlock()
	if g == nil {
		return transport.Errorf(transport.ErrNotFound, "no communicator for group %q", name)
	}
	g.destroy(transport.Errorf(transport.ErrClosed, "rdt_group_destroy was called"), false)
	return g.awaitTeardown(time.NewTimer(t.teardown))
}

// destroy ends the group: with abort (ncclCommAbort, after a failure) or
// gracefully (ncclCommDestroy). Later transfers fail with the first cause.
// A graceful destroy lets the transfers whose NCCL work is enqueued finish
// first ("freed after its pending work"); an abort meanwhile, or a failure
// of one of them, aborts the communicator instead. Either way NCCL frees
// the communicators in the background (see startTeardown).
func (g *group) destroy(cause error, abort bool) {
	g.mu.Lock()
	first := g.dead == nil
	if first {
		g.dead = transport.Errorf(transport.StatusOf(cause), "group %q was destroyed after %v", g.name, cause)
		if transport.StatusOf(cause) == transport.ErrClosed {
			g.dead = transport.Errorf(transport.ErrClosed, "group %q was destroyed: %v", g.name, cause)
		}
		close(g.deadCh)
	}
	if abort && !g.aborted && !g.freed {
		g.aborted = true
		g.mu.Unlock()
		g.t.h.Log().Warnf("group %q (rank %d of %d) destroyed after %v; destroy and re-create it to use it again", g.name, g.rank, g.roster.WorldSize(), cause)
		g.startTeardown(true)
		return
	}
	g.mu.Unlock()
	if abort || !first {
		return
	}
	g.active.Wait()
	g.mu.Lock()
	if g.aborted {
		g.mu.Unlock()
		return
	}
	g.freed = true
	g.mu.Unlock()
	g.startTeardown(false)
}

// startTeardown frees the communicators (ncclCommAbort, or ncclCommDestroy
// when freed) and then the streams, once, each lane on a goroutine of its
// own. NCCL's teardown is collective on a host: a rank's proxy serves the
// connections its peers hold until they tear down too, so ncclCommDestroy
// and ncclCommAbort return only once the group's other ranks here have
// destroyed theirs, or exited. No caller waits for that longer than its
// own bound (awaitTeardown); g.torn closes when it is over, and lanes of
// one group never wait for each other, whatever order peers tear down in.
// The caller has set aborted or freed, so no other NCCL call is under way
// or will start (see mu).
func (g *group) startTeardown(abort bool) {
	g.tearOnce.Do(func() {
		start := time.Now()
		errs := make([]error, numLanes)
		var wg sync.WaitGroup
		for i, l := range g.lanes {
			if l == nil {
				continue
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				if l.comm != nil {
					if abort {
						errs[i] = l.comm.Abort()
					} else {
						errs[i] = l.comm.Destroy()
					}
				}
				// An enqueue that saw the group dead may still be
				// leaving: the stream goes after it.
				l.enq.Lock()
				if l.stream != nil {
					l.stream.Destroy()
				}
				l.enq.Unlock()
			}()
		}
		go func() {
			wg.Wait()
			if g.scratch != 0 {
				// No NCCL work is left to write into it.
				cuda.Free(g.dev, g.scratch)
			}
			for _, err := range errs {
				if err != nil {
					g.tornErr = err
					break
				}
			}
			close(g.torn)
			if took := time.Since(start); took >= g.t.teardown {
				g.t.h.Log().Infof("group %q: NCCL freed its communicators after %v", g.name, took.Round(time.Millisecond))
			}
		}()
	})
}

// awaitTeardown waits for NCCL to free the communicators, or for timer.
func (g *group) awaitTeardown(timer *time.Timer) error {
	defer timer.Stop()
	select {
	case <-g.torn:
		return g.tornErr
	case <-timer.C:
		return transport.Errorf(transport.ErrTimeout, "group %q: NCCL did not free the communicators within %v: it frees them once the group's other ranks on this host destroy theirs too (or exit), in the background (RDT_NCCL_TEARDOWN_MS sets this wait)", g.name, g.t.teardown)
	}
}

func (g *group) deadErr() error {
	g.mu.RLock()
	defer g.mu.RUnlock()
	return g.dead
}

// groupWith finds this runtime's group that also holds peer, with both
// ranks. Live groups first, then by name.
func (t *Transport) groupWith(peer transport.RuntimeID) (*group, int, error) {
	t.mu.Lock()
	var live, dead []*group
	for _, g := range t.groups {
		if g.roster.RankOf(peer) < 0 {
			continue
		}
		if g.deadErr() == nil {
			live = append(live, g)
		} else {
			dead = append(dead, g)
		}
	}
	t.mu.Unlock()
	byName := func(s []*group) { sort.Slice(s, func(i, j int) bool { return s[i].name < s[j].name }) }
	byName(live)
	byName(dead)
	if len(live) > 0 {
		return live[0], live[0].roster.RankOf(peer), nil
	}
	if len(dead) > 0 {
		return nil, 0, dead[0].deadErr()
	}
	return nil, 0, transport.Errorf(transport.ErrUnsupported, "this runtime and the source runtime are not ranks of one nccl group; create one on both with rdt_group_create (Python: create_collective_group), or fetch with another transport (cuda_ipc on the same host, nixl, or tcp for host memory)")
}

func (t *Transport) lookup(m *cmeta) (*group, error) {
	t.mu.Lock()
	g := t.groups[m.Group]
	t.mu.Unlock()
	if g == nil {
		return nil, transport.Errorf(transport.ErrNotFound, "no group %q in this runtime (destroyed?)", m.Group)
	}
	if g.roster.Instance != m.Instance {
		return nil, transport.Errorf(transport.ErrNotFound, "group %q was re-created since the transfer was planned", m.Group)
	}
	if m.Src >= g.roster.WorldSize() || m.Dst >= g.roster.WorldSize() {
		return nil, transport.Errorf(transport.ErrCorrupt, "ranks %d and %d are outside group %q of %d", m.Src, m.Dst, m.Group, g.roster.WorldSize())
	}
	if err := g.deadErr(); err != nil {
		return nil, err
	}
	return g, nil
}

// op is one enqueued (or about to be) send or receive.
type op struct {
	abort     chan struct{}
	abortOnce sync.Once
}

func (o *op) stop() { o.abortOnce.Do(func() { close(o.abort) }) }

func (t *Transport) register(id uint64) *op {
	o := &op{abort: make(chan struct{})}
	t.mu.Lock()
	t.ops[id] = o
	if _, ok := t.aborted[id]; ok {
		delete(t.aborted, id)
		o.stop()
	}
	t.mu.Unlock()
	return o
}

func (t *Transport) unregister(id uint64) {
	t.mu.Lock()
	delete(t.ops, id)
	t.mu.Unlock()
}

// buffers checks that tensors live on the group's device.
func (g *group) buffers(tensors []transport.Tensor, what string) ([]Buffer, error) {
	bufs := make([]Buffer, len(tensors))
	for i, x := range tensors {
		if err := g.onDevice(x, what, i); err != nil {
			return nil, err
		}
		bufs[i] = Buffer{Ptr: x.Data, Nbytes: x.Nbytes}
	}
	return bufs, nil
}

// onDevice checks that tensor i (what names its kind) lives on the group's
// device.
func (g *group) onDevice(x transport.Tensor, what string, i int) error {
	if x.Device.Type != transport.DeviceCUDA || int(x.Device.ID) != g.dev {
		return transport.Errorf(transport.ErrInvalidArgument, "%s %d is on %s, but this rank of group %q uses cuda:%d", what, i, x.Device, g.name, g.dev)
	}
	return nil
}

// run waits for the transfer's turn in order, enqueues it, and polls it to
// completion. Any failure or abort after the order was assigned destroys
// the group: the other side may already have enqueued its half.
func (g *group) run(o *op, send bool, peer int, seq uint64, bufs []Buffer, what string) error {
	err := g.transfer(o, send, peer, seq, bufs, what)
	if err != nil && transport.StatusOf(err) != transport.ErrClosed {
		if g.deadErr() == nil {
			g.destroy(transport.Errorf(transport.StatusOf(err), "%s failed: %v", what, err), true)
		}
		if dead := g.deadErr(); dead != nil {
			return dead
		}
	}
	return err
}

// transfer moves bufs to or from peer as transfer seq between the two
// ranks: it waits for that turn, enqueues the work, passes the turn on and
// polls until the work is done.
func (g *group) transfer(o *op, send bool, peer int, seq uint64, bufs []Buffer, what string) error {
	next, l := g.recvNext, g.laneOf(peer, g.rank)
	if send {
		next, l = g.sendNext, g.laneOf(g.rank, peer)
	}
	if err := g.awaitTurn(o, next, peer, seq); err != nil {
		return err
	}
	ev, err := cuda.NewEvent(g.dev)
	if err != nil {
		return err
	}
	defer ev.Destroy()
	started, err := g.enqueue(o, l, send, peer, bufs, ev)
	if !started {
		return err
	}
	defer g.active.Done()
	g.passTurn(next, peer, seq)
	if err != nil {
		return err
	}
	return g.poll(o, l, ev, what)
}

// awaitTurn waits for our turn: transfers between two ranks are enqueued
// on both sides in the order the destination assigned.
func (g *group) awaitTurn(o *op, next map[int]uint64, peer int, seq uint64) error {
	for {
		g.mu.RLock()
		dead, at, ch := g.dead, next[peer], g.changed
		g.mu.RUnlock()
		if dead != nil {
			return dead
		}
		if at == seq {
			return nil
		}
		if at > seq {
			return transport.Errorf(transport.ErrInternal, "transfer %d from rank %d came after transfer %d", seq, peer, at)
		}
		select {
		case <-ch:
		case <-o.abort:
			return transport.Errorf(transport.ErrAborted, "aborted before it started")
		case <-g.deadCh:
		}
	}
}

// enqueue enqueues the work on the lane's stream, then records ev after
// it. started is false when the group died before anything was enqueued;
// otherwise the transfer counts as active (the caller calls
// g.active.Done), and err says whether the enqueue or the record failed.
func (g *group) enqueue(o *op, l *lane, send bool, peer int, bufs []Buffer, ev *cuda.Event) (started bool, err error) {
	l.enq.Lock()
	defer l.enq.Unlock()
	g.mu.RLock()
	dead := g.dead
	var busy bool
	if dead == nil {
		g.active.Add(1)
		// A failed P2P launched nothing (NCCL launches no part of a
		// group that fails).
		busy, err = l.comm.P2P(send, peer, bufs, l.stream)
	}
	g.mu.RUnlock()
	if dead != nil {
		return false, dead
	}
	if err == nil && busy {
		err = g.awaitLaunch(o, l)
	}
	if err == nil {
		if rerr := ev.Record(l.stream); rerr != nil {
			// Enqueued, but there is nothing to watch it with: stop it,
			// and wait for the stream instead.
			g.destroy(transport.Errorf(transport.StatusOf(rerr), "recording an event after it failed: %v", rerr), true)
			l.stream.Synchronize()
			err = rerr
		}
	}
	return true, err
}

// awaitLaunch waits until NCCL has put the lane's last group on its stream
// (it connects the two ranks first, the first time, which lasts until the
// peer posts its half). An abort of the transfer or of the group ends the
// wait at once: NCCL's own thread, stopped by the abort, launches nothing
// that moves bytes after it.
func (g *group) awaitLaunch(o *op, l *lane) error {
	deadCh := g.deadCh
	for delay := 5 * time.Microsecond; ; delay = min(delay*2, time.Millisecond) {
		g.mu.RLock()
		aborted, dead := g.aborted, g.dead
		var ok bool
		var err error
		if !aborted {
			ok, err = l.comm.Ready()
		}
		g.mu.RUnlock()
		switch {
		case aborted:
			return dead
		case ok || err != nil:
			return err
		}
		t := time.NewTimer(delay)
		select {
		case <-o.abort:
			t.Stop()
			return transport.Errorf(transport.ErrAborted, "aborted while NCCL connected and launched it")
		case <-deadCh:
			t.Stop()
			deadCh = nil // destroyed or aborted: the next check tells which
		case <-t.C:
		}
	}
}

// passTurn lets the transfer after seq between the two ranks go ahead.
func (g *group) passTurn(next map[int]uint64, peer int, seq uint64) {
	g.mu.Lock()
	next[peer] = seq + 1
	close(g.changed)
	g.changed = make(chan struct{})
	g.mu.Unlock()
}

// poll waits for the enqueued work: the event says the bytes moved; the
// communicator's async error says NCCL failed (a peer died, a network
// error). Only a completion seen before an abort counts: ncclCommAbort
// ends enqueued work early, and the event completes all the same. A
// graceful destroy waits for this transfer, and the communicator stays
// usable until it is over.
func (g *group) poll(o *op, l *lane, ev *cuda.Event, what string) error {
	deadCh := g.deadCh
	for delay := 5 * time.Microsecond; ; delay = min(delay*2, time.Millisecond) {
		g.mu.RLock()
		aborted := g.aborted
		var done bool
		var qerr, aerr error
		if !aborted {
			done, qerr = ev.Query()
			if qerr == nil {
				aerr = l.comm.AsyncError()
			}
		}
		g.mu.RUnlock()
		switch {
		case aborted:
			g.settle(ev)
			return g.deadErr()
		case qerr != nil:
			return g.fail(ev, qerr, what)
		case aerr != nil:
			return g.fail(ev, aerr, what)
		case done:
			return nil
		}
		select {
		case <-o.abort:
			return g.fail(ev, transport.Errorf(transport.ErrAborted, "aborted"), what)
		case <-deadCh:
			deadCh = nil // destroyed or aborted: the next poll tells which
		case <-time.After(delay):
		}
	}
}

// fail ends a transfer whose NCCL work is enqueued: the communicator is
// aborted, which ends the work, and fail returns once NCCL no longer reads
// or writes the transfer's tensors.
func (g *group) fail(ev *cuda.Event, err error, what string) error {
	g.destroy(transport.Errorf(transport.StatusOf(err), "%s failed: %v", what, err), true)
	g.settle(ev)
	return err
}

// settle waits until the work recorded before ev is over, which the
// communicator's abort makes happen soon (NCCL stops its work).
func (g *group) settle(ev *cuda.Event) {
	for delay := 5 * time.Microsecond; ; delay = min(delay*2, time.Millisecond) {
		if done, err := ev.Query(); done || err != nil {
			return
		}
		time.Sleep(delay)
	}
}
