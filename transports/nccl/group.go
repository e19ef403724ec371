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
	enq    sync.Mutex // NCCL enqueue calls (a communicator is not thread-safe)
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

	mu         sync.RWMutex // held for reading around calls that use a communicator
	dead       error
	deadCh     chan struct{}
	aborted    bool           // ncclCommAbort was called
	freed      bool           // ncclCommDestroy was called
	active     sync.WaitGroup // transfers whose NCCL work is enqueued (or being enqueued)
	changed    chan struct{}  // closed and replaced when an order advances
	recvAssign map[int]uint64 // destination: next sequence number per source rank
	recvNext   map[int]uint64 // destination: next to enqueue per source rank
	sendNext   map[int]uint64 // source: next to enqueue per destination rank
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

// InitGroup implements transport.GroupBackend: ncclCommInitRank of each lane on
// the rank's device, then the connection of every pair of ranks, bounded by
// ctx. If ctx ends during ncclCommInitRank, the communicators NCCL may
// still form are destroyed when they do.
func (t *Transport) InitGroup(ctx context.Context, r *transport.GroupRoster, spec transport.GroupSpec) error {
	if len(r.Bootstrap) != numLanes*UniqueIDSize {
		return transport.Errorf(transport.ErrCorrupt, "rank 0 sent %d bytes of unique ids, not %d", len(r.Bootstrap), numLanes*UniqueIDSize)
	}
	if err := checkDevice(spec.Device); err != nil {
		return err
	}
	type result struct {
		cs  []*Comm
		err error
	}
	// Every rank forms the lanes in the same order (ncclCommInitRank is
	// collective).
	done := make(chan result, 1)
	go func() {
		var res result
		for i := range numLanes {
			var id UniqueID
			copy(id[:], r.Bootstrap[i*UniqueIDSize:])
			c, err := InitRank(spec.Device, r.WorldSize(), spec.Rank, id)
			if err != nil {
				res.err = err
				break
			}
			res.cs = append(res.cs, c)
		}
		done <- res
	}()
	var res result
	select {
	case res = <-done:
	case <-ctx.Done():
		go func() {
			for _, c := range (<-done).cs {
				c.Destroy()
			}
		}()
		return transport.Errorf(transport.ErrTimeout, "ncclCommInitRank did not complete in time (every rank joined the group; is a rank's NCCL stuck or its process gone?)")
	}
	g := &group{t: t, roster: r, name: r.Name, rank: spec.Rank, dev: spec.Device,
		deadCh: make(chan struct{}), changed: make(chan struct{}),
		recvAssign: map[int]uint64{}, recvNext: map[int]uint64{}, sendNext: map[int]uint64{}}
	err := res.err
	for i, c := range res.cs {
		g.lanes[i] = &lane{comm: c}
		if err == nil {
			var serr error
			g.lanes[i].stream, serr = cuda.NewStream(spec.Device)
			err = serr
		}
	}
	if err != nil {
		for _, l := range g.lanes {
			if l != nil {
				l.comm.Destroy()
				if l.stream != nil {
					l.stream.Destroy()
				}
			}
		}
		return err
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

// connect makes NCCL connect this rank with every other rank, on both
// lanes, before the group is used. NCCL connects two ranks at the first
// send or receive between them, and that ncclGroupEnd blocks until the
// peer posts its half. Left to the first transfers, ranks fetching from
// each other around a cycle (0 from 1, 1 from 2, 2 from 0) could each block
// inside NCCL holding a lane's enqueue lock, waiting for an enqueue that
// waits behind the next rank's lock: a deadlock until the deadlines abort
// them all. Every rank calls connect, with one group per lane holding a
// one-byte send or receive for every peer, which NCCL connects all at
// once; lane by lane, each finished before the next starts (connecting
// allocates NCCL's buffers, and NCCL warns that work of one communicator
// may wait for another's kernels then). On failure or at ctx's end the
// communicators are aborted and the streams destroyed.
func (g *group) connect(ctx context.Context) error {
	n := g.roster.WorldSize()
	if n == 1 {
		return nil
	}
	aborted := false
	abort := func() {
		if !aborted {
			aborted = true
			for _, l := range g.lanes {
				l.comm.Abort() // also releases an enqueue blocked in NCCL
			}
		}
	}
	fail := func(err error) error {
		abort()
		for _, l := range g.lanes {
			l.stream.Destroy()
		}
		return err
	}
	scratch, err := cuda.Alloc(g.dev, uint64(n)+1)
	if err != nil {
		return fail(err)
	}
	ev, err := cuda.NewEvent(g.dev)
	if err != nil {
		cuda.Free(g.dev, scratch)
		return fail(err)
	}
	defer ev.Destroy()
	for i, l := range g.lanes {
		if err := g.connectLane(ctx, l, i == 0, uintptr(scratch), ev, abort); err != nil {
			// The abort ends the work; then NCCL no longer writes into
			// scratch (an event never recorded is done).
			err = fail(err)
			g.settle(ev)
			cuda.Free(g.dev, scratch)
			return err
		}
	}
	cuda.Free(g.dev, scratch)
	return nil
}

// connectLane runs one lane's connection and waits for it; on error the
// caller aborts the communicators (abort, which connectLane calls itself
// to release an enqueue that outlives ctx).
func (g *group) connectLane(ctx context.Context, l *lane, up bool, scratch uintptr, ev *cuda.Event, abort func()) error {
	n := g.roster.WorldSize()
	timeout := transport.Errorf(transport.ErrTimeout, "NCCL did not connect the %d ranks in time (every rank joined the group; is a rank's process gone?)", n)
	enq := make(chan error, 1)
	go func() {
		err := l.comm.Connect(g.rank, n, up, scratch, l.stream)
		if err == nil {
			if rerr := ev.Record(l.stream); rerr != nil {
				err = rerr
			}
		}
		enq <- err
	}()
	select {
	case err := <-enq:
		if err != nil {
			return err
		}
	case <-ctx.Done():
		abort() // releases the enqueue; wait for it to come out
		<-enq
		return timeout
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

// DestroyGroup implements transport.GroupBackend: ncclCommDestroy (or nothing
// more if a failure already aborted it).
func (t *Transport) DestroyGroup(name string) error {
	t.mu.Lock()
	g := t.groups[name]
	delete(t.groups, name)
	t.mu.Unlock()
	if g == nil {
		return transport.Errorf(transport.ErrNotFound, "no communicator for group %q", name)
	}
	return g.destroy(transport.Errorf(transport.ErrClosed, "rdt_group_destroy was called"), false)
}

// destroy ends the group: with abort (ncclCommAbort, after a failure) or
// gracefully (ncclCommDestroy). Later transfers fail with the first cause.
// A graceful destroy lets the transfers whose NCCL work is enqueued finish
// first ("freed after its pending work"); an abort meanwhile, or a failure
// of one of them, aborts the communicator instead.
func (g *group) destroy(cause error, abort bool) error {
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
		return g.abortComm()
	}
	g.mu.Unlock()
	if abort || !first {
		return nil
	}
	g.active.Wait()
	g.mu.Lock()
	if g.aborted {
		g.mu.Unlock()
		return nil
	}
	g.freed = true
	g.mu.Unlock()
	var err error
	for _, l := range g.lanes {
		// Taken out under the lane's lock, destroyed outside it:
		// ncclCommDestroy waits for the other ranks, and a transfer that
		// passed its turn meanwhile must get the lock, see the group dead
		// and return, not wait that long where no abort reaches it.
		l.enq.Lock()
		comm, stream := l.comm, l.stream
		l.comm, l.stream = nil, nil
		l.enq.Unlock()
		if derr := comm.Destroy(); err == nil {
			err = derr
		}
		stream.Destroy()
	}
	return err
}

// abortComm calls ncclCommAbort on every lane. An enqueue blocked inside
// NCCL (a peer that never connects) is only released by it, so it does not
// wait for one; but a lane's stream goes only once that enqueue is out of
// NCCL and no longer records on it.
func (g *group) abortComm() error {
	var err error
	for _, l := range g.lanes {
		var aerr error
		if l.enq.TryLock() {
			aerr = l.comm.Abort()
			l.stream.Destroy()
			l.enq.Unlock()
		} else {
			aerr = l.comm.Abort()
			go func() {
				l.enq.Lock()
				l.stream.Destroy()
				l.enq.Unlock()
			}()
		}
		if err == nil {
			err = aerr
		}
	}
	if err != nil {
		return err
	}
	return nil
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
	started, err := g.enqueue(o, l, send, peer, bufs, ev, what)
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
func (g *group) enqueue(o *op, l *lane, send bool, peer int, bufs []Buffer, ev *cuda.Event, what string) (started bool, err error) {
	// The enqueue can wait: for another transfer's enqueue, and inside NCCL,
	// whose first send or receive between two ranks blocks until the peer
	// connects. An abort meanwhile can only reach it by aborting the
	// communicator.
	enqueued := make(chan struct{})
	go func() {
		select {
		case <-o.abort:
			g.destroy(transport.Errorf(transport.ErrAborted, "%s was aborted while NCCL enqueued it", what), true)
		case <-enqueued:
		}
	}()
	l.enq.Lock()
	g.mu.RLock()
	dead := g.dead
	if dead == nil {
		g.active.Add(1)
	}
	g.mu.RUnlock()
	if dead != nil {
		l.enq.Unlock()
		close(enqueued)
		return false, dead
	}
	// A failed P2P launched nothing (NCCL launches no part of a group that
	// fails).
	err = l.comm.P2P(send, peer, bufs, l.stream)
	if err == nil {
		if rerr := ev.Record(l.stream); rerr != nil {
			// Enqueued, but there is nothing to watch it with: stop it,
			// and wait for the stream instead.
			cerr := rerr
			g.destroy(transport.Errorf(transport.StatusOf(cerr), "%s failed: %v", what, cerr), true)
			l.stream.Synchronize()
			err = rerr
		}
	}
	l.enq.Unlock()
	close(enqueued)
	return true, err
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
