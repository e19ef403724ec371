package engine

import (
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rdt-project/rdt/core/control"
	"github.com/rdt-project/rdt/core/transport"
)

// Writes into exposed objects. The owner exposes tensors (Expose); the
// writable ref it hands out carries a random write key, the capability. A
// holder's write is a fetch the other way (StartWrite): it asks the owner
// to admit it (control.KindWriteOpen, carrying the key, the ranges and the
// writer's tag), moves the bytes with a transport's Write, then tells the
// owner the outcome (KindWriteDone, one-way, sent only once no byte of the
// write can land any more). The owner turns every admitted write into one
// notice: success when the writer says every byte landed, failure when it
// says otherwise or is gone with the write still open (a torn write). An
// admitted write pins the object, so its memory outlives every write.
//
// A prepared write asks once for a standing admission (WriteOpen.Standing)
// and then runs without asking: each run ends with a write done carrying
// its tag and Keep, which the owner turns into that run's notice while the
// admission stays open. An admission covers a number of runs, each with a
// notice reserved in the bounded queue; its last run ends it, and the next
// asks again, so a writer whose notices are not taken is refused as any
// other. Revoking withdraws standing admissions (KindWriteWithdrawn): the
// writer closes each (WriteEnd.Close) once no run of it is in progress,
// and only then does the revocation end. Each run after the first (which
// the write open begins) is announced with its tag (KindWriteRun) before
// any byte of it can land: a writer gone mid-run tears the admission like
// an open write, with that run's tag; one gone between runs wrote nothing
// that has no notice, so the admission closes without one.

// This file is the owner's side: exposing, each object's open writes and
// notices, revoking; admitting and ending writes is the gate's (gate.go).
// The writer's side is in write.go.

// WriteNotice is the owner's record of one ended write.
type WriteNotice struct {
	Tag    uint64              // the writer's
	Writer transport.RuntimeID // the writing runtime
	Bytes  uint64              // what the write covered
	// Err is nil when every byte of the write landed; otherwise the bytes
	// it covered may hold any mix of old and new values (torn).
	Err error
}

// Limits of one exposed object: writes admitted and not ended, plus
// notices not taken yet. A write is refused (ErrNoMemory) rather than
// queued past it, so an owner that takes no notices slows its writers.
const maxPendingNotices = 4096

// standingRuns is the most runs one standing admission covers: a writer
// asks again after this many, so it waits for the owner once per
// standingRuns runs, and one admission reserves at most this much of the
// queue. An admission is granted an eighth of the room left, so that many
// writers holding admissions at once still leave room for more.
const standingRuns = 256

// exposure is the owner's record of an object exposed for writing.
type exposure struct {
	mu      sync.Mutex
	revoked bool
	closed  bool // the object was freed
	open    map[openKey]*openWrite
	notices []WriteNotice
	// reserved counts the notices standing admissions may still queue
	// (their runs left): admissions keep open+notices+reserved within
	// maxPendingNotices.
	reserved int
	// changed is closed and replaced whenever a notice is queued, a write
	// ends or the exposure closes: what waiters wait on.
	changed chan struct{}
	// eventFD is readable while notices are queued (see NoticeFD); -1 until
	// asked for.
	eventFD int
	// unpin lets a finished write's object go. finishLocked calls it under
	// mu, before the write leaves the open set and before its notice, so
	// whoever sees either sees the object unpinned. (The store frees on a
	// goroutine of its own: it never takes mu back.)
	unpin func(*object)
}

type openKey struct {
	writer transport.RuntimeID
	id     uint64
}

// openWrite is an admitted write. A server landing its bytes (WriteInto)
// makes it busy; a write ended while busy is finished (its notice, the
// unpin) by the last server to let go.
type openWrite struct {
	tag, nbytes uint64
	pieces      []transport.Piece // what it may touch, merged; nil: every tensor, whole
	o           *object           // pinned while the write is open
	busy        int
	ended       bool
	endErr      error
	// standing admissions (see the top of this file): runs end without
	// ending it until its last; withdrawn once the writer was told to
	// close it; silent when it closes without a run, so without a notice.
	standing  bool
	running   bool // a run is under way (tag is its); else nothing lands
	runs      int  // runs left, each with a notice reserved
	writer    transport.PeerInfo
	withdrawn bool
	silent    bool
}

func newExposure(unpin func(*object)) *exposure {
	return &exposure{open: map[openKey]*openWrite{}, changed: make(chan struct{}), eventFD: -1, unpin: unpin}
}

// wakeLocked wakes every waiter.
func (ex *exposure) wakeLocked() {
	close(ex.changed)
	ex.changed = make(chan struct{})
}

// admit records an open write, within the limits.
func (ex *exposure) admit(k openKey, w *openWrite, id transport.ObjectID) error {
	ex.mu.Lock()
	defer ex.mu.Unlock()
	switch {
	case ex.closed:
		return transport.Errorf(transport.ErrNotFound, "object %s was already freed by its owner", id)
	case ex.revoked:
		return transport.Errorf(transport.ErrPermissionDenied, "the owner revoked writes into object %s", id)
	case len(ex.open)+len(ex.notices)+ex.reserved >= maxPendingNotices:
		return transport.Errorf(transport.ErrNoMemory, "object %s has %d writes open and %d notices not taken, the limit: its owner must take notices (rdt_write_notice_wait) before more writes are admitted", id, len(ex.open), len(ex.notices))
	}
	if _, dup := ex.open[k]; dup {
		return transport.Errorf(transport.ErrInvalidArgument, "write %d of runtime %s into object %s is already open", k.id, k.writer, id)
	}
	if w.standing {
		// Its own slot (the open write) covers its last run.
		room := maxPendingNotices - len(ex.open) - len(ex.notices) - ex.reserved
		w.runs = max(1, min(standingRuns, room/8))
		ex.reserved += w.runs - 1
	}
	ex.open[k] = w
	return nil
}

// end records what a writer said of an open write (see control.WriteEnd).
// known is false when it was not open (never admitted, or ended already).
// A write no server lands bytes of finishes now; a busy one is finished by
// the last server to let go; a run of a standing admission stays open.
func (ex *exposure) end(k openKey, end control.WriteEnd) (known bool) {
	ex.mu.Lock()
	defer ex.mu.Unlock()
	w, ok := ex.open[k]
	if !ok || w.ended {
		return false
	}
	if !w.standing {
		end.Keep, end.Close, end.Tag = false, false, w.tag // flags of standing admissions only
	}
	switch {
	case end.Close:
		w.silent = true
	case end.Keep && end.Err == nil && w.runs > 1:
		// A run's notice takes one of the slots the admission reserved.
		w.runs--
		w.running = false
		ex.reserved--
		ex.pushLocked(WriteNotice{Tag: end.Tag, Writer: k.writer, Bytes: w.nbytes})
		return true
	}
	// Anything else ends it, its notice in the write's own slot: a write
	// admitted on its own, a run that failed or did not keep the
	// admission, and a Keep on its last covered run.
	ex.reserved -= max(w.runs-1, 0)
	w.runs = 0
	w.ended, w.endErr, w.tag = true, end.Err, end.Tag
	if w.busy == 0 {
		ex.finishLocked(k, w)
	}
	return true
}

// finishLocked closes an ended write that no server lands bytes of: its
// object is unpinned, then its notice queued (none for a standing
// admission closed without a run).
func (ex *exposure) finishLocked(k openKey, w *openWrite) {
	ex.unpin(w.o)
	delete(ex.open, k)
	if w.silent {
		ex.wakeLocked()
		return
	}
	ex.pushLocked(WriteNotice{Tag: w.tag, Writer: k.writer, Bytes: w.nbytes, Err: w.endErr})
}

// run records that a run of the standing admission k begins, with tag.
// known is false when k is no standing admission open.
func (ex *exposure) run(k openKey, tag uint64) (known bool) {
	ex.mu.Lock()
	defer ex.mu.Unlock()
	w, ok := ex.open[k]
	if !ok || w.ended || !w.standing {
		return false
	}
	w.running, w.tag = true, tag
	return true
}

// withdrawStanding withdraws every standing admission still open and not
// withdrawn yet, and returns their writers and ids, to be told.
func (ex *exposure) withdrawStanding() []withdrawal {
	ex.mu.Lock()
	defer ex.mu.Unlock()
	var out []withdrawal
	for k, w := range ex.open {
		if w.standing && !w.ended && !w.withdrawn {
			w.withdrawn = true
			out = append(out, withdrawal{writer: w.writer, id: k.id})
		}
	}
	return out
}

// withdrawal is a standing admission its writer is to be told to close.
type withdrawal struct {
	writer transport.PeerInfo
	id     uint64
}

// tear ends with cause every open write of writer (zero: of every writer)
// and counts them; those a server lands bytes of finish when it lets go.
func (ex *exposure) tear(writer transport.RuntimeID, cause error) int {
	ex.mu.Lock()
	defer ex.mu.Unlock()
	torn := 0
	for k, w := range ex.open {
		if (!writer.IsZero() && k.writer != writer) || w.ended {
			continue
		}
		ex.reserved -= max(w.runs-1, 0)
		w.runs = 0
		w.ended, w.endErr = true, cause
		if w.standing && !w.running {
			w.silent = true // between runs: every byte it moved has its notice
			if w.busy == 0 {
				ex.finishLocked(k, w)
			}
			continue
		}
		torn++
		if w.busy == 0 {
			ex.finishLocked(k, w)
		}
	}
	return torn
}

// into makes the open write id busy for a server landing its bytes; done
// lets go, finishing the write if it ended meanwhile.
func (ex *exposure) into(id uint64) (*openWrite, func(), error) {
	ex.mu.Lock()
	defer ex.mu.Unlock()
	for k, w := range ex.open {
		if k.id != id {
			continue
		}
		if w.ended {
			break
		}
		w.busy++
		return w, func() {
			ex.mu.Lock()
			defer ex.mu.Unlock()
			w.busy--
			if w.ended && w.busy == 0 {
				ex.finishLocked(k, w)
			}
		}, nil
	}
	return nil, nil, transport.Errorf(transport.ErrNotFound, "write %d is not open (it was never admitted, or ended)", id)
}

func (ex *exposure) pushLocked(n WriteNotice) {
	if !ex.closed {
		ex.notices = append(ex.notices, n)
		if len(ex.notices) == 1 && ex.eventFD >= 0 {
			signalEventFD(ex.eventFD)
		}
	}
	ex.wakeLocked()
}

// numOpen counts the writes admitted and not ended.
func (ex *exposure) numOpen() int {
	ex.mu.Lock()
	defer ex.mu.Unlock()
	return len(ex.open)
}

// take removes the oldest notice, if any.
func (ex *exposure) take() (WriteNotice, bool, <-chan struct{}, bool) {
	ex.mu.Lock()
	defer ex.mu.Unlock()
	if len(ex.notices) == 0 {
		return WriteNotice{}, false, ex.changed, ex.closed
	}
	n := ex.notices[0]
	ex.notices[0] = WriteNotice{}
	ex.notices = ex.notices[1:]
	if len(ex.notices) == 0 {
		ex.notices = nil // let the backing array go
		if ex.eventFD >= 0 {
			drainEventFD(ex.eventFD)
		}
	}
	return n, true, nil, ex.closed
}

// close ends the exposure when its object is freed: waiters wake, the
// event descriptor closes.
func (ex *exposure) close() {
	ex.mu.Lock()
	defer ex.mu.Unlock()
	ex.closed = true
	ex.notices = nil
	if ex.eventFD >= 0 {
		unix.Close(ex.eventFD)
		ex.eventFD = -1
	}
	ex.wakeLocked()
}

func drainEventFD(fd int) {
	var b [8]byte
	_, _ = unix.Read(fd, b[:])
}

// Expose stores tensors as a new object that holders of its refs write
// into (see rdt_expose): like Put, but its refs are writable and it is
// never fetched. Every write into it ends in one notice (WaitWriteNotice).
func (rt *Runtime) Expose(tensors []transport.Tensor, transportName string, release func()) (*Ref, error) {
	return rt.put(tensors, transportName, release, true)
}

// exposureOf is the exposure of an object r's runtime owns.
func (r *Ref) exposureOf() (*object, error) {
	if err := r.check(); err != nil {
		return nil, err
	}
	if !r.owned {
		return nil, transport.Errorf(transport.ErrInvalidArgument, "ref to object %s is a writer's: only its owner %s takes notices and revokes", r.desc.ID, r.desc.Owner.Address)
	}
	if !r.desc.Writable {
		return nil, transport.Errorf(transport.ErrInvalidArgument, "object %s was put, not exposed for writing", r.desc.ID)
	}
	return r.rt.store.owned(r.desc.ID)
}

// WaitWriteNotice takes the oldest notice of a write into the exposed
// object, waiting up to timeout (negative: forever) for one: ErrTimeout
// when none came.
func (r *Ref) WaitWriteNotice(timeout time.Duration) (WriteNotice, error) {
	o, err := r.exposureOf()
	if err != nil {
		return WriteNotice{}, err
	}
	deadline, stop := timerFor(timeout)
	defer stop()
	for {
		n, ok, changed, closed := o.write.take()
		switch {
		case ok:
			return n, nil
		case closed:
			return n, transport.Errorf(transport.ErrNotFound, "object %s was freed", r.desc.ID)
		case timeout == 0:
			return n, transport.Errorf(transport.ErrTimeout, "no write notice of object %s", r.desc.ID)
		}
		select {
		case <-changed:
		case <-deadline:
			return n, transport.Errorf(transport.ErrTimeout, "no write notice of object %s within %v", r.desc.ID, timeout)
		case <-r.rt.ctx.Done():
			return n, transport.Errorf(transport.ErrClosed, "runtime %s was destroyed", r.rt.me.name)
		}
	}
}

// WriteNoticeFD returns a descriptor that is readable while notices of the
// exposed object wait to be taken. Made on the first call; it belongs to
// the object and closes when the object is freed.
func (r *Ref) WriteNoticeFD() (int, error) {
	o, err := r.exposureOf()
	if err != nil {
		return -1, err
	}
	ex := o.write
	ex.mu.Lock()
	defer ex.mu.Unlock()
	if ex.eventFD >= 0 {
		return ex.eventFD, nil
	}
	if ex.closed {
		return -1, transport.Errorf(transport.ErrNotFound, "object %s was freed", r.desc.ID)
	}
	fd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		return -1, transport.Errorf(transport.ErrNoMemory, "eventfd: %v", err)
	}
	ex.eventFD = fd
	if len(ex.notices) > 0 {
		signalEventFD(fd)
	}
	return fd, nil
}

// RevokeWrites stops admitting writes into the exposed object and ends
// the leases of its serialized refs, then waits up to timeout (negative:
// forever) until no admitted write is open: from then on nothing writes
// into its memory. ErrTimeout leaves the revocation in place; call again to
// wait more. Writers still holding refs keep the object (not its memory's
// use) until they release them.
func (r *Ref) RevokeWrites(timeout time.Duration) error {
	o, err := r.exposureOf()
	if err != nil {
		return err
	}
	ex := o.write
	ex.mu.Lock()
	first := !ex.revoked
	ex.revoked = true
	ex.mu.Unlock()
	if first {
		r.rt.store.revokeLeases(o)
		r.rt.log.Debugf("revoked writes into object %s", r.desc.ID)
	}
	// Standing admissions end when their writers close them, between runs.
	r.rt.gate.withdraw(r.rt.ep, o, o.write.withdrawStanding(), transport.Errorf(transport.ErrPermissionDenied, "the owner revoked writes into object %s", r.desc.ID))
	deadline, stop := timerFor(timeout)
	defer stop()
	for {
		ex.mu.Lock()
		open, changed := len(ex.open), ex.changed
		ex.mu.Unlock()
		if open == 0 {
			return nil
		}
		if timeout == 0 {
			return transport.Errorf(transport.ErrTimeout, "%d writes into object %s are still open", open, r.desc.ID)
		}
		select {
		case <-changed:
		case <-deadline:
			return transport.Errorf(transport.ErrTimeout, "%d writes into object %s are still open after %v", open, r.desc.ID, timeout)
		}
	}
}

// timerFor is the channel a wait of timeout selects on: nil (never) unless
// timeout is positive; stop releases the timer.
func timerFor(timeout time.Duration) (<-chan time.Time, func() bool) {
	if timeout <= 0 {
		return nil, func() bool { return false }
	}
	timer := time.NewTimer(timeout)
	return timer.C, timer.Stop
}
