package cma

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/rdt-project/rdt/core/transport"
	"golang.org/x/sys/unix"
)

type procKey struct {
	pid       int
	startTime uint64
}

// proc pins the identity of a source process with a pidfd: once it is
// readable the process has exited, and whatever its pid now names is
// someone else. Requests hold it (users) while they read; a proc dropped
// from the table (its peer is gone) closes its pidfd once the last of them
// is done.
// The pidfd is an *os.File so that closing it while a request still polls
// it is safe: the poll then fails, which counts as exited.
type proc struct {
	pidfd *os.File

	users   int  // under Transport.mu
	dropped bool // under Transport.mu: out of the table, close when unused

	guardMu sync.Mutex
	guards  []addrRange // the process's guard mappings seen so far
}

type addrRange struct{ start, end uint64 }

// exited reports whether the process is gone, without blocking.
func (p *proc) exited() bool { return transport.ProcessExited(p.pidfd) }

// source finds or opens the pidfd of a source process, checking that the
// pid still belongs to the process the metadata describes. The caller
// must hand the proc back with done.
func (t *Transport) source(pid int, startTime uint64) (*proc, error) {
	k := procKey{pid, startTime}
	t.mu.Lock()
	defer t.mu.Unlock()
	if p, ok := t.procs[k]; ok {
		if !p.exited() {
			p.users++
			return p, nil
		}
		t.forgetLocked(k)
		return nil, transport.Errorf(transport.ErrPeerUnavailable, "source process %d is gone", pid)
	}
	// A new source: drop the sources that exited meanwhile, should their
	// runtime's end not have been reported (see PeerGone).
	for k, p := range t.procs {
		if p.exited() {
			t.forgetLocked(k)
		}
	}
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		if errors.Is(err, unix.ESRCH) {
			return nil, transport.Errorf(transport.ErrPeerUnavailable, "source process %d is gone", pid)
		}
		// Kernels before 5.3 lack pidfds: fall back to the start time alone.
		if err := checkAlive(pid, startTime); err != nil {
			return nil, err
		}
		return &proc{users: 1, dropped: true}, nil
	}
	// The pidfd names whoever holds the pid now; make sure it is our source.
	if err := checkAlive(pid, startTime); err != nil {
		unix.Close(fd)
		return nil, err
	}
	p := &proc{pidfd: os.NewFile(uintptr(fd), "pidfd"), users: 1}
	if t.procs == nil {
		t.procs = map[procKey]*proc{}
	}
	t.procs[k] = p
	return p, nil
}

// done hands back a proc taken by source.
func (t *Transport) done(p *proc) {
	t.mu.Lock()
	defer t.mu.Unlock()
	p.users--
	if p.dropped && p.users == 0 && p.pidfd != nil {
		p.pidfd.Close()
	}
}

func (t *Transport) forgetLocked(k procKey) {
	p, ok := t.procs[k]
	if !ok {
		return
	}
	delete(t.procs, k)
	p.dropped = true
	if p.users == 0 && p.pidfd != nil {
		p.pidfd.Close()
	}
}

// openSources is the number of source processes with a pidfd held.
func (t *Transport) openSources() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.procs)
}

func (t *Transport) CommunicatorMetadata(x *transport.Transfer) ([]byte, error) { return nil, nil }

// Fetch checks the metadata against the targets and the source's guard
// slot, and starts reading.
func (t *Transport) Fetch(x *transport.Transfer, targets []transport.Tensor, tmeta, cmeta []byte) (transport.Request, error) {
	return t.start(x, targets, tmeta)
}

// start checks the metadata of the owner's object against the local
// tensors (targets of a fetch, sources of a write) and the owner's guard
// slot, and starts the copy the way x.Direction says.
func (t *Transport) start(x *transport.Transfer, local []transport.Tensor, tmeta []byte) (transport.Request, error) {
	p, err := t.prepare(x, local, tmeta)
	if err != nil {
		return nil, err
	}
	p.oneShot = true // the request lets go of the source when released
	return p.Start(x)
}

// Prepare implements transport.Preparer: start's checks (the metadata
// against the local tensors, the owner's process and the guard slot) once,
// for a transfer started again and again. Each start still checks, after
// the copy, that the owner lived through it and that the object's guard
// holds its token, as every transfer does.
func (t *Transport) Prepare(x *transport.Transfer, local []transport.Tensor, tmeta, cmeta []byte) (transport.Prepared, error) {
	return t.prepare(x, local, tmeta)
}

// prepared is a checked transfer: Start copies.
type prepared struct {
	t       *Transport
	m       *metadata
	src     *proc
	local   []transport.Tensor
	total   uint64
	dir     transport.Direction
	oneShot bool // made by Fetch or Write for one request, which owns src
}

func (t *Transport) prepare(x *transport.Transfer, local []transport.Tensor, tmeta []byte) (*prepared, error) {
	owner := x.Owner()
	m, err := decodeMetadata(tmeta)
	if err != nil {
		return nil, err
	}
	// Ref bytes are checksummed, not signed: touch no process but the owner
	// the control plane identified.
	if int(m.Pid) != owner.Pid {
		return nil, transport.Errorf(transport.ErrCorrupt,
			"the metadata of object %s names process %d, but its owner %s is process %d: refusing to touch another process's memory",
			x.Object, m.Pid, owner, owner.Pid)
	}
	if err := x.CheckPieces(local, len(m.Regions), func(i int) uint64 { return m.Regions[i].Size }); err != nil {
		return nil, err
	}
	var total uint64
	for i, tg := range local {
		if !tg.Device.Type.HostAccessible() {
			return nil, transport.Errorf(transport.ErrUnsupported, "tensor %d is in %s memory; cma moves host memory only", i, tg.Device)
		}
		total += tg.Nbytes
	}
	src, err := t.source(int(m.Pid), m.StartTime)
	if err != nil {
		return nil, err
	}
	p := &prepared{t: t, m: m, src: src, local: local, total: total, dir: x.Direction}
	if err := p.request().checkSlot(x.Object, tmeta); err != nil {
		t.done(src)
		return nil, err
	}
	return p, nil
}

func (p *prepared) request() *request {
	m := p.m
	return &request{Completion: transport.NewCompletion(), t: p.t, pid: int(m.Pid), startTime: m.StartTime, src: p.src,
		guard: m.Guard, token: m.Token, dir: p.dir, ownsSrc: p.oneShot}
}

// Start copies (small copies at once, larger ones on a goroutine).
func (p *prepared) Start(x *transport.Transfer) (transport.Request, error) {
	req := p.request()
	if p.total <= syncLimit {
		req.Finish(req.copyChecked(x, p.m.Regions, p.local, 1))
		return req, nil
	}
	go func() {
		req.Finish(req.copyChecked(x, p.m.Regions, p.local, p.t.workers))
	}()
	return req, nil
}

// Close lets go of the owner's process descriptor.
func (p *prepared) Close() { p.t.done(p.src) }

// Abort makes the workers stop at their next chunk.
func (t *Transport) Abort(x *transport.Transfer, r transport.Request) {
	if req, ok := r.(*request); ok {
		req.aborted.Store(true)
	}
}

// request is a fetch in progress: it completes when the copy ends
// (Completed lets the engine skip a goroutine for copies done in Fetch).
type request struct {
	*transport.Completion
	t         *Transport
	pid       int
	startTime uint64
	src       *proc
	guard     uint64 // address of the object's guard slot in the source
	token     uint64
	dir       transport.Direction // a write moves into the owner, a read out of it
	ownsSrc   bool                // a prepared transfer's requests leave src to it
	aborted   atomic.Bool
	released  sync.Once
}

// Release lets go of the source's process descriptor (unless a prepared
// transfer holds it).
func (r *request) Release() {
	r.released.Do(func() {
		if r.ownsSrc {
			r.t.done(r.src)
		}
	})
}

// span is one piece of work: a byte range of one tensor.
type span struct {
	remote, local uintptr
	n             uint64
}

// copyChecked copies, then makes sure the source lived through the copy:
// bytes read after it exited could come from a process that reused its pid.
func (r *request) copyChecked(x *transport.Transfer, regions []region, targets []transport.Tensor, workers int) error {
	err := r.copyAll(x, regions, targets, workers)
	if err != nil {
		return err
	}
	if r.src.exited() {
		return transport.Errorf(transport.ErrPeerUnavailable, "source process %d exited during the transfer", r.pid)
	}
	return r.checkGuard()
}

// checkSlot runs before the copy: the metadata's guard slot must lie in one
// of the source's guard mappings and hold the metadata's token and digest,
// which only the owner's own extraction of this object wrote there. Addresses
// in ref bytes are thus never read unless the owner put them.
func (r *request) checkSlot(obj transport.ObjectID, tmeta []byte) error {
	ok, err := r.src.isGuard(r.pid, r.guard)
	if err != nil {
		if alive := checkAlive(r.pid, r.startTime); alive != nil {
			return alive
		}
		return transport.Errorf(transport.ErrPermissionDenied, "cannot read the memory map of source process %d: %v; use the shm transport instead", r.pid, err)
	}
	if !ok {
		return transport.Errorf(transport.ErrCorrupt,
			"the metadata of object %s names no guard slot of its owner (process %d): refusing to read addresses the owner did not put", obj, r.pid)
	}
	var b [slotRead]byte
	if err := r.readRemote(b[:], r.guard); err != nil {
		return err
	}
	if binary.LittleEndian.Uint64(b[:8]) != r.token {
		return transport.Errorf(transport.ErrPeerUnavailable, "the source freed object %s (its runtime was destroyed, or the ref is stale)", obj)
	}
	if want := metaDigest(obj, tmeta); !bytes.Equal(b[8:], want[:]) {
		return transport.Errorf(transport.ErrCorrupt,
			"the metadata of object %s is not what its owner (process %d) made for it: refusing to read addresses the owner did not put", obj, r.pid)
	}
	return nil
}

// readRemote reads len(b) bytes at addr in the source.
func (r *request) readRemote(b []byte, addr uint64) error {
	local := []unix.Iovec{{Base: &b[0]}}
	local[0].SetLen(len(b))
	remote := []unix.RemoteIovec{{Base: uintptr(addr), Len: len(b)}}
	for {
		n, err := unix.ProcessVMReadv(r.pid, local, remote, 0)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return r.explain(err)
		}
		if n != len(b) {
			return r.explain(unix.EFAULT)
		}
		return nil
	}
}

// isGuard reports whether the slot at addr lies in one of the process's
// guard mappings. The mappings seen are kept; an address outside them
// reads /proc/<pid>/maps again (a new chunk of slots).
func (p *proc) isGuard(pid int, addr uint64) (bool, error) {
	p.guardMu.Lock()
	defer p.guardMu.Unlock()
	inside := func() bool {
		for _, g := range p.guards {
			if addr >= g.start && addr+slotSize <= g.end {
				return true
			}
		}
		return false
	}
	if inside() {
		return true, nil
	}
	guards, err := guardMappings(pid)
	if err != nil {
		return false, err
	}
	p.guards = guards
	return inside(), nil
}

// maxGuardMappings bounds what is kept of one process's map: 64 Mi objects.
const maxGuardMappings = 1 << 16

// guardMappings lists the guard mappings in /proc/<pid>/maps, whose lines
// read "start-end perms offset dev inode path"; a memfd's path is
// "/memfd:<name> (deleted)".
func guardMappings(pid int) ([]addrRange, error) {
	f, err := os.Open("/proc/" + strconv.Itoa(pid) + "/maps")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	const suffix = " /memfd:" + guardName + " (deleted)"
	var out []addrRange
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 4096), 64<<10)
	for sc.Scan() && len(out) < maxGuardMappings {
		line := sc.Text()
		if !strings.HasSuffix(line, suffix) {
			continue
		}
		fields := strings.Fields(line)
		if len(fields) < 6 || !strings.HasPrefix(fields[1], "rw") {
			continue
		}
		lo, hi, ok := strings.Cut(fields[0], "-")
		if !ok {
			continue
		}
		start, err1 := strconv.ParseUint(lo, 16, 64)
		end, err2 := strconv.ParseUint(hi, 16, 64)
		if err1 == nil && err2 == nil && start < end {
			out = append(out, addrRange{start, end})
		}
	}
	return out, sc.Err()
}

// checkGuard reads the object's guard word after the copy: if it no longer
// holds the token, the source freed the object (its runtime was destroyed)
// and the bytes may be someone else's.
func (r *request) checkGuard() error {
	var b [8]byte
	if err := r.readRemote(b[:], r.guard); err != nil {
		if alive := checkAlive(r.pid, r.startTime); alive != nil {
			return alive
		}
		return transport.Errorf(transport.ErrPeerUnavailable, "the source's object is gone (its runtime was destroyed)")
	}
	if binary.LittleEndian.Uint64(b[:]) != r.token {
		return transport.Errorf(transport.ErrPeerUnavailable, "the source freed the object while it was being read (its runtime was destroyed); the bytes are not used")
	}
	return nil
}

// copyAll reads into each target its piece of the regions (the whole
// region in a whole fetch). Large pieces are cut into spans shared by up to
// `workers` goroutines; small ones are gathered into batches that one
// process_vm_readv reads at once (one call per batch, not one per tensor).
func (r *request) copyAll(x *transport.Transfer, regions []region, targets []transport.Tensor, workers int) error {
	var spans []span
	for i, tg := range targets {
		p := x.PieceOf(i, tg)
		if p.Length == 0 {
			continue
		}
		base := regions[p.Tensor].Addr + p.Offset
		parts := uint64(1)
		if p.Length >= parallelMin && workers > 1 {
			parts = uint64(workers)
		}
		per := (p.Length + parts - 1) / parts
		per = (per + 4095) &^ 4095 // page-aligned pieces
		for off := uint64(0); off < p.Length; off += per {
			n := min(per, p.Length-off)
			spans = append(spans, span{remote: uintptr(base + off), local: tg.Data + uintptr(off), n: n})
		}
	}
	batches := batch(spans)
	if len(batches) == 0 {
		return nil
	}
	if workers <= 1 || len(batches) == 1 {
		var v vectors
		for _, b := range batches {
			if err := r.move(b, &v); err != nil {
				return err
			}
		}
		return nil
	}
	var (
		next     atomic.Int64
		wg       sync.WaitGroup
		errOnce  sync.Once
		firstErr error
	)
	for w := 0; w < min(workers, len(batches)); w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var v vectors
			for {
				i := int(next.Add(1) - 1)
				if i >= len(batches) {
					return
				}
				if err := r.move(batches[i], &v); err != nil {
					errOnce.Do(func() { firstErr = err })
					r.aborted.Store(true) // stop the other workers
					return
				}
			}
		}()
	}
	wg.Wait()
	return firstErr
}

// batch groups spans into the work of single process_vm_readv calls: at
// most maxIovecs spans and chunkSize bytes each, a span larger than that
// alone in its batches, cut into chunks (so an abort is seen between them).
func batch(spans []span) [][]span {
	var out [][]span
	var cur []span
	var bytes uint64
	for _, s := range spans {
		for s.n > 0 {
			if len(cur) == maxIovecs || bytes == chunkSize {
				out, cur, bytes = append(out, cur), nil, 0
			}
			n := min(s.n, chunkSize-bytes)
			cur = append(cur, span{remote: s.remote, local: s.local, n: n})
			bytes += n
			s.remote += uintptr(n)
			s.local += uintptr(n)
			s.n -= n
		}
	}
	if len(cur) > 0 {
		out = append(out, cur)
	}
	return out
}

// vectors are one reader's iovec arrays, reused from batch to batch.
type vectors struct {
	local  []unix.Iovec
	remote []unix.RemoteIovec
}

// fill describes a batch to the kernel. Spans that follow each other in
// memory (tensors that are views of one buffer, say) become one iovec on
// that side: the kernel's cost is per iovec more than per byte, and the
// two sides' lists need not match.
func (v *vectors) fill(b []span) {
	v.local, v.remote = v.local[:0], v.remote[:0]
	var localEnd, remoteEnd uintptr
	for _, s := range b {
		if n := len(v.local); n > 0 && s.local == localEnd {
			v.local[n-1].SetLen(int(v.local[n-1].Len) + int(s.n))
		} else {
			l := unix.Iovec{Base: (*byte)(transport.Foreign(s.local))}
			l.SetLen(int(s.n))
			v.local = append(v.local, l)
		}
		if n := len(v.remote); n > 0 && s.remote == remoteEnd {
			v.remote[n-1].Len += int(s.n)
		} else {
			v.remote = append(v.remote, unix.RemoteIovec{Base: s.remote, Len: int(s.n)})
		}
		localEnd, remoteEnd = s.local+uintptr(s.n), s.remote+uintptr(s.n)
	}
}

// move copies one batch with as few process_vm_readv (process_vm_writev,
// for a write) calls as the kernel allows: a call that stops short (a
// signal, a page it could not reach) is resumed where it stopped, and one
// that moves nothing is an error.
func (r *request) move(b []span, v *vectors) error {
	for len(b) > 0 {
		if r.aborted.Load() {
			return transport.Errorf(transport.ErrAborted, "transfer aborted")
		}
		v.fill(b)
		got, err := r.vm(v)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return r.explain(err)
		}
		if got <= 0 {
			// The source's mapping ended early: it is exiting or unmapped.
			return r.explain(unix.EFAULT)
		}
		// Drop what arrived: whole spans, then the front of a partial one.
		for got > 0 {
			if uint64(got) >= b[0].n {
				got -= int(b[0].n)
				b = b[1:]
				continue
			}
			b[0].remote += uintptr(got)
			b[0].local += uintptr(got)
			b[0].n -= uint64(got)
			got = 0
		}
	}
	return nil
}

// explain turns an errno into an error that says what happened and what to
// do about it.
func (r *request) explain(err error) error {
	switch {
	case errors.Is(err, unix.EPERM):
		return transport.Errorf(transport.ErrPermissionDenied,
			"%s of pid %d was refused (ptrace permission: Yama ptrace_scope %s, seccomp or a different user); use the shm transport instead",
			r.syscall(), r.pid, yamaDescription())
	case errors.Is(err, unix.ENOSYS):
		return transport.Errorf(transport.ErrUnsupported, "%s is not available here (seccomp or an old kernel); use the shm transport instead", r.syscall())
	case errors.Is(err, unix.ESRCH):
		return transport.Errorf(transport.ErrPeerUnavailable, "source process %d is gone", r.pid)
	}
	if alive := checkAlive(r.pid, r.startTime); alive != nil {
		return alive
	}
	return transport.Errorf(transport.ErrInternal, "%s of pid %d: %v (the owner's memory is no longer mapped)", r.syscall(), r.pid, err)
}

// vm makes the one system call of a batch: process_vm_writev into the
// owner in a write, process_vm_readv from it in a read.
func (r *request) vm(v *vectors) (int, error) {
	if r.dir == transport.Write {
		return unix.ProcessVMWritev(r.pid, v.local, v.remote, 0)
	}
	return unix.ProcessVMReadv(r.pid, v.local, v.remote, 0)
}

func (r *request) syscall() string {
	if r.dir == transport.Write {
		return "process_vm_writev"
	}
	return "process_vm_readv"
}

// checkAlive guards against a dead source and a recycled pid.
func checkAlive(pid int, startTime uint64) error {
	st, err := processStartTime(pid)
	if err != nil {
		return transport.Errorf(transport.ErrPeerUnavailable, "source process %d is gone", pid)
	}
	if st != startTime {
		return transport.Errorf(transport.ErrPeerUnavailable, "source process %d is gone (its pid now belongs to another process)", pid)
	}
	return nil
}
