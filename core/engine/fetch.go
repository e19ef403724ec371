package engine

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rdt-project/rdt/core/transport"
)

// FetchOptions adjust one fetch.
type FetchOptions struct {
	// Transport overrides the transport of every ref ("" keeps each ref's
	// own or the automatic choice).
	Transport string
	// Sources, when not nil, make the fetch partial: target i receives
	// Sources[i], and a ref none of them names is not fetched.
	Sources []Range

	dir transport.Direction // Write for StartWrite, Write and PrepareWrite (write.go)
	tag uint64              // a write's, handed to its owners
}

// Fetch is a set of concurrent transfers, one per ref, waited on together;
// each transfer's own state machine is in transfer.go.
type Fetch struct {
	rt        *Runtime
	transfers []*transfer
	override  string              // the transport every ref is fetched with ("": each its own)
	dir       transport.Direction // Write: a write into exposed objects
	tag       uint64              // a write's
	start     time.Time           // when the fetch was asked for: its transfers' latencies count from here
	// ctx bounds the network phases of every transfer (connecting to the
	// owner, the borrow, metadata): it ends when the fetch is aborted, and
	// at the caller's deadline for Get.
	ctx       context.Context
	cancel    context.CancelFunc
	done      chan struct{} // closed when every transfer finished
	abortCh   chan struct{}
	abortOnce sync.Once
	freeOnce  sync.Once

	remaining atomic.Int64 // transfers not finished

	mu  sync.Mutex
	err error // the first error
	// sealed is set once every transfer ended: the outcome (err) is final.
	// Until then a caller giving up at its deadline (giveUp) makes it a
	// timeout, so that what the caller returns and what a write's owners
	// are told (endWrites) are one outcome.
	sealed bool

	// The completion eventfd (see EventFD): made on first request, written
	// once when done closes, closed by Free. eventMu orders those three, so
	// a completion is never missed and nothing writes to a closed number.
	eventMu sync.Mutex
	eventFD int // -1: none yet
	freed   bool
}

// StartFetch validates the arguments and returns a running fetch without
// waiting on the network: connecting to the owners, the borrows, metadata
// and the transfers themselves run in the background, bounded by the
// fetch's own life (Abort, Free) and waited on with Wait. Errors of those
// phases are the fetch's result. See rdt_get_start.
func (rt *Runtime) StartFetch(refs []*Ref, targets []transport.Tensor, opts FetchOptions) (*Fetch, error) {
	ctx, cancel := context.WithCancel(rt.ctx)
	f, err := newFetch(rt, refs, targets, opts, ctx, cancel)
	if err != nil {
		cancel()
		return nil, err
	}
	// The caller of StartFetch waits on nothing: transfers that must wait
	// to start do so in the background.
	started, later := f.startInline(false)
	if len(later) == 0 {
		f.complete(started, false, false)
		return f, nil
	}
	go func() {
		f.complete(append(started, f.startAll(later)...), true, true)
	}()
	return f, nil
}

// startInline starts, on the caller's goroutine, every transfer whose start
// needs no wait (a connected owner, metadata at hand: most of them), as a
// fetch that completes at once then needs no goroutine. It returns those
// started and those that must wait to start. A transfer that fails ends
// here, unless its end may wait for the owner (awaitsOwner) and mayWait is
// false: then it is returned as started, with its error, for complete.
func (f *Fetch) startInline(mayWait bool) (started, later []*transfer) {
	// A caller that waits anyway (Get, Write) starts its one transfer here
	// even when that waits on the owner (a write's admission, metadata):
	// handing it to a goroutine would only add hand-offs. Several transfers
	// start concurrently, so their waits overlap.
	inline := !mayWait || len(f.transfers) > 1
	for _, tr := range f.transfers {
		tr.inline = inline
		err := tr.protectedBegin()
		tr.inline = false
		switch {
		case err == nil:
			started = append(started, tr)
		case errors.Is(err, errWouldBlock):
			later = append(later, tr)
		case !mayWait && tr.awaitsOwner(err):
			tr.failed = err
			started = append(started, tr)
		default:
			tr.end(err)
		}
	}
	return started, later
}

// Get is StartFetch, Wait and Free in one call, with one deadline for all of
// it: the start phase runs on the caller's goroutine under that deadline (so
// a fetch that completes at once needs no other goroutine), and what is left
// when it passes is aborted before Get returns. A negative timeout waits
// forever.
func (rt *Runtime) Get(refs []*Ref, targets []transport.Tensor, opts FetchOptions, timeout time.Duration) error {
	return rt.get(refs, targets, opts, timeout, nil)
}

// get is Get; ended, when not nil, sees the fetch once it succeeded, before
// it is freed (a Prepared keeps what its transfers resolved).
func (rt *Runtime) get(refs []*Ref, targets []transport.Tensor, opts FetchOptions, timeout time.Duration, ended func(*Fetch)) error {
	if timeout == 0 {
		if _, err := checkFetchArgs(rt, refs, targets, opts); err != nil {
			return err
		}
		if err := noTimeForPeers(refs, opts.dir); err != nil {
			return err
		}
		timeout = -1 // this runtime's own objects: copies that wait for no one
	}
	var ctx context.Context
	var cancel context.CancelFunc
	if timeout >= 0 {
		ctx, cancel = context.WithDeadlineCause(rt.ctx, time.Now().Add(timeout), errGetDeadline)
	} else {
		ctx, cancel = context.WithCancel(rt.ctx)
	}
	f, err := newFetch(rt, refs, targets, opts, ctx, cancel)
	if err != nil {
		cancel()
		return err
	}
	defer f.Free()
	started, later := f.startInline(true)
	f.complete(append(started, f.startAll(later)...), false, true)
	result := func() error {
		err := f.result()
		if err == nil && ended != nil {
			ended(f)
		}
		return err
	}
	// The context's deadline is the wait's: no second timer.
	select {
	case <-f.done:
		return result()
	case <-ctx.Done():
	}
	select {
	case <-f.done:
		return result()
	default:
	}
	if !errors.Is(ctx.Err(), context.DeadlineExceeded) {
		// Not the deadline but the runtime's end, which ends the fetch.
		<-f.done
		return result()
	}
	timedOut := transport.Errorf(transport.ErrTimeout, "%s did not complete within %v (%d of %d transfers still running)", f.dir.Verb(), timeout, f.remaining.Load(), len(f.transfers))
	if !f.giveUp(timedOut) {
		<-f.done // it ended as the deadline passed: its outcome stands
		return result()
	}
	return timedOut
}

// noTimeForPeers is the outcome of a get, write, prepared run or view
// given timeout 0 (docs/abi.md, "Timeouts"): no time to involve another
// runtime, so one that would is refused with ErrTimeout before anything
// starts, on every transport alike; only a runtime's own objects, which
// need no other process, are fetched, written or viewed.
func noTimeForPeers(refs []*Ref, dir transport.Direction) error {
	what := "fetched"
	if dir == transport.Write {
		what = "written"
	}
	for i, r := range refs {
		if !r.owned {
			return transport.Errorf(transport.ErrTimeout, "timeout 0 leaves no time to reach the owner of ref %d (object %s at %s): nothing was %s", i, r.desc.ID, r.desc.Owner.Address, what)
		}
	}
	return nil
}

// giveUp makes err the outcome of a fetch whose caller stops waiting for
// it, unless every transfer ended already (false: the outcome stands),
// and aborts what still runs.
func (f *Fetch) giveUp(err error) bool {
	f.mu.Lock()
	if f.sealed {
		f.mu.Unlock()
		return false
	}
	if f.err == nil {
		f.err = err
	}
	f.mu.Unlock()
	f.Abort()
	return true
}

// checkFetchArgs checks a fetch's (or a write's) refs, which must be rt's,
// and tensors, and plans what each ref's transfer moves.
func checkFetchArgs(rt *Runtime, refs []*Ref, targets []transport.Tensor, opts FetchOptions) ([]*refTargets, error) {
	for i, r := range refs {
		if err := r.check(); err != nil {
			return nil, transport.Wrap(err, "ref %d", i)
		}
		if r.rt != rt {
			return nil, transport.Errorf(transport.ErrInvalidArgument, "ref %d belongs to runtime %s, not %s", i, r.rt.me.name, rt.me.name)
		}
	}
	if err := checkDirection(refs, opts.dir); err != nil {
		return nil, err
	}
	// A write's sources are only read: they may overlap.
	return planTargets(refs, targets, opts.Sources, opts.dir == transport.Read)
}

// newFetch checks the arguments, takes the fetch's own handles on the
// objects and registers the fetch with runtime rt. Nothing runs yet. The
// fetch takes ctx and cancels it when aborted or freed.
func newFetch(rt *Runtime, refs []*Ref, targets []transport.Tensor, opts FetchOptions, ctx context.Context, cancel context.CancelFunc) (*Fetch, error) {
	plans, err := checkFetchArgs(rt, refs, targets, opts)
	if err != nil {
		return nil, err
	}
	override := ""
	if opts.Transport != "" {
		e, err := rt.reg.lookup(opts.Transport)
		if err != nil {
			return nil, err
		}
		override = e.desc.Name
	}

	f := &Fetch{rt: rt, override: override, dir: opts.dir, tag: opts.tag, start: time.Now(), done: make(chan struct{}), abortCh: make(chan struct{}), eventFD: -1}
	for i, r := range refs {
		p := plans[i]
		if p == nil {
			continue // the sources name none of its tensors
		}
		c, err := r.Clone()
		if err != nil {
			for _, tr := range f.transfers {
				tr.ref.Release()
			}
			return nil, transport.Wrap(err, "ref %d", i)
		}
		tr := &transfer{f: f, index: i, ref: c, targets: p.targets, pieces: p.pieces}
		for _, t := range p.targets {
			tr.nbytes += t.Nbytes
		}
		f.transfers = append(f.transfers, tr)
	}
	if err := rt.store.addFetch(f); err != nil {
		for _, tr := range f.transfers {
			tr.ref.Release()
		}
		return nil, err
	}
	rt.c.fetchesActive.Add(1)
	f.ctx, f.cancel = ctx, cancel
	f.remaining.Store(int64(len(f.transfers)))
	return f, nil
}

// startAll runs the start phase of the transfers, concurrently, and returns
// those that started. A transfer that fails to start ends there, and its
// error aborts the others.
func (f *Fetch) startAll(trs []*transfer) []*transfer {
	ok := make([]bool, len(trs))
	var wg sync.WaitGroup
	for i, tr := range trs {
		if i == 0 {
			continue // started on this goroutine below
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			ok[i] = f.startOne(tr)
		}()
	}
	if len(trs) > 0 {
		ok[0] = f.startOne(trs[0])
	}
	wg.Wait()
	var started []*transfer
	for i, tr := range trs {
		if ok[i] {
			started = append(started, tr)
		}
	}
	return started
}

func (f *Fetch) startOne(tr *transfer) bool {
	err := tr.protectedBegin()
	if tr.waitCancel != nil {
		tr.waitCancel()
	}
	if err != nil {
		tr.end(err)
		return false
	}
	return true
}

// complete runs the started transfers to their end (every transfer is
// started before any is waited on) and closes f.done after the last.
// Transfers that finished inside the transport's fetch end on this
// goroutine, unless their failure awaits the owner's answer and mayWait is
// false (StartFetch's caller waits on nothing); the others get their own.
// With block, complete returns only at the end; without, it returns once
// the rest runs in the background.
func (f *Fetch) complete(started []*transfer, block, mayWait bool) {
	var wg sync.WaitGroup
	spawned := 0
	for _, tr := range started {
		var err error
		if tr.completed() {
			if err = tr.protectedRun(); mayWait || !tr.awaitsOwner(err) {
				tr.end(err)
				continue
			}
		}
		spawned++
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err == nil {
				err = tr.protectedRun()
			}
			tr.end(err)
		}()
	}
	switch {
	case spawned == 0:
		f.markDone()
	case block:
		wg.Wait()
		f.markDone()
	default:
		go func() {
			wg.Wait()
			f.markDone()
		}()
	}
}

// markDone seals the fetch's outcome, tells the owners of a write how it
// ended, closes f.done and signals the completion eventfd, if one was
// asked for.
func (f *Fetch) markDone() {
	f.mu.Lock()
	f.sealed = true
	f.mu.Unlock()
	f.endWrites()
	f.eventMu.Lock()
	defer f.eventMu.Unlock()
	close(f.done)
	if f.eventFD >= 0 {
		signalEventFD(f.eventFD)
	}
}

// EventFD returns a file descriptor that becomes readable once the fetch is
// complete (Wait(0) no longer times out) and stays readable until Free,
// which closes it. It is made on the first call; later calls return the
// same one. See rdt_pending_event_fd.
func (f *Fetch) EventFD() (int, error) {
	f.eventMu.Lock()
	defer f.eventMu.Unlock()
	if f.freed {
		return -1, transport.Errorf(transport.ErrInvalidArgument, "the fetch was freed")
	}
	if f.eventFD >= 0 {
		return f.eventFD, nil
	}
	fd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		return -1, transport.Errorf(transport.ErrNoMemory, "eventfd: %v", err)
	}
	f.eventFD = fd
	select {
	case <-f.done:
		signalEventFD(fd) // completed before anyone asked
	default:
	}
	return fd, nil
}

// signalEventFD adds one to an eventfd's counter, which makes it readable.
// It cannot block or fail: the counter is written once per fetch, and the
// fd is nonblocking.
func signalEventFD(fd int) {
	var one [8]byte
	binary.NativeEndian.PutUint64(one[:], 1)
	_, _ = unix.Write(fd, one[:])
}

// record keeps the first error and aborts the rest of the fetch.
func (f *Fetch) record(err error) {
	if err == nil {
		return
	}
	f.mu.Lock()
	first := f.err == nil
	if first {
		f.err = err
	}
	f.mu.Unlock()
	if first {
		f.Abort()
	}
}

// Wait waits for every transfer, up to timeout (negative: forever). On
// ErrTimeout the fetch keeps running.
func (f *Fetch) Wait(timeout time.Duration) error {
	select {
	case <-f.done:
		return f.result()
	default:
	}
	if timeout < 0 {
		<-f.done
		return f.result()
	}
	if timeout == 0 {
		select {
		case <-f.done:
			return f.result()
		default:
			return transport.Errorf(transport.ErrTimeout, "fetch has not completed")
		}
	}
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case <-f.done:
		return f.result()
	case <-timer.C:
		return transport.Errorf(transport.ErrTimeout, "fetch did not complete within %v (%d of %d transfers still running)", timeout, f.remaining.Load(), len(f.transfers))
	}
}

func (f *Fetch) result() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.err
}

// Abort asks every unfinished transfer to stop, in whatever phase it is;
// it does not wait.
func (f *Fetch) Abort() {
	f.abortOnce.Do(func() {
		close(f.abortCh)
		f.cancel()
	})
}

// Done is closed when no transfer of the fetch runs any more.
func (f *Fetch) Done() <-chan struct{} { return f.done }

// Free aborts what still runs, waits until nothing writes into the targets,
// and unregisters the fetch.
func (f *Fetch) Free() {
	select {
	case <-f.done:
	default:
		f.Abort()
		<-f.done
	}
	f.freeOnce.Do(func() {
		f.cancel()
		rt := f.rt
		rt.store.removeFetch(f)
		rt.c.fetchesActive.Add(-1)
		f.eventMu.Lock()
		f.freed = true
		if f.eventFD >= 0 {
			unix.Close(f.eventFD)
			f.eventFD = -1
		}
		f.eventMu.Unlock()
	})
}

func (f *Fetch) String() string { return fmt.Sprintf("fetch of %d refs", len(f.transfers)) }
