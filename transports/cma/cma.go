// Package cma moves host memory between processes on one host with
// cross-memory attach: the receiver reads the source's pages with
// process_vm_readv straight into its targets. One copy, no staging, and the
// source does nothing per transfer.
package cma

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/rdt-project/rdt/core/transport"
)

// Name is the canonical transport name.
const Name = "cma"

const (
	// chunkSize bounds one process_vm_readv call, so that an abort is seen
	// promptly and a large tensor can be split between workers.
	chunkSize = 8 << 20
	// syncLimit: transfers up to this size run inside Fetch. A goroutine
	// hand-off costs more than the copy itself.
	syncLimit = 256 << 10
	// parallelMin: tensors at least this large are read by several workers.
	parallelMin = 32 << 20
	maxWorkers  = transport.MaxCMAWorkers
)

// Factory makes the transport for a new runtime.
func Factory() transport.TransportFactory {
	return transport.TransportFactory{Name: Name, New: New}
}

// Transport is the cma transport of one runtime.
type Transport struct {
	h         transport.Host
	pid       int
	startTime uint64
	workers   int

	mu    sync.Mutex
	procs map[procKey]*proc // sources read from, by pid and start time

	guards guardTable
}

// guardTable hands out guard slots: one per object, in memfd-backed
// mappings named guardName that receivers read with process_vm_readv. A
// slot holds the object's random token while it lives, and a SHA-256 digest
// of the object id and of the metadata the owner made for it.
//
// Before copying, a receiver checks that the slot its metadata names lies
// in one of the source's guard mappings (the kernel names them in
// /proc/<pid>/maps, so nothing a ref says can fake one) and holds the
// metadata's token and digest: a ref whose addresses were changed, even with
// a valid checksum, is refused before a byte is read. After copying it reads
// the token again: garbage_collect zeroes it before the application gets
// its memory back, so a receiver that still sees it knows the bytes it read
// were the object's. Without that, a receiver that had not yet noticed its
// owner's runtime was destroyed could read memory the application already
// reused.
type guardTable struct {
	mu     sync.Mutex
	chunks [][]byte
	free   []*guardSlot
	byObj  map[transport.ObjectID]*guardSlot
}

const (
	guardName  = "rdt-cma-guards"
	guardChunk = 64 << 10 // one memfd mapping: 1024 slots
	slotSize   = 64
	// slotRead is what a receiver reads of a slot: token and digest.
	slotRead = 8 + sha256.Size
)

// guardSlot is the layout of one slot in the guard mappings.
type guardSlot struct {
	token  uint64 // 0: free; written last, cleared first
	digest [sha256.Size]byte
	_      [slotSize - 8 - sha256.Size]byte
}

// metaDigest binds metadata to the object it was made for.
func metaDigest(obj transport.ObjectID, meta []byte) [sha256.Size]byte {
	h := sha256.New()
	h.Write([]byte(guardName))
	h.Write(obj[:])
	h.Write(meta)
	var d [sha256.Size]byte
	h.Sum(d[:0])
	return d
}

// take gives obj a slot and a token and returns its metadata, which
// encode makes from the slot's address and the token. The digest is
// written before the token, both under the lock: a receiver that sees the
// token sees the digest that goes with it.
func (g *guardTable) take(obj transport.ObjectID, encode func(guard, token uint64) []byte) ([]byte, error) {
	var tb [8]byte
	if _, err := rand.Read(tb[:]); err != nil {
		return nil, transport.Errorf(transport.ErrInternal, "cma: %v", err)
	}
	token := binary.LittleEndian.Uint64(tb[:]) | 1 // never zero
	g.mu.Lock()
	defer g.mu.Unlock()
	// The core extracts an object's metadata once per transport.
	if _, ok := g.byObj[obj]; ok {
		return nil, transport.Errorf(transport.ErrInternal, "cma: object %s already has metadata", obj)
	}
	if len(g.free) == 0 {
		chunk, err := newGuardChunk()
		if err != nil {
			return nil, err
		}
		g.chunks = append(g.chunks, chunk)
		for off := guardChunk - slotSize; off >= 0; off -= slotSize {
			g.free = append(g.free, (*guardSlot)(unsafe.Pointer(&chunk[off])))
		}
	}
	w := g.free[len(g.free)-1]
	g.free = g.free[:len(g.free)-1]
	if g.byObj == nil {
		g.byObj = map[transport.ObjectID]*guardSlot{}
	}
	g.byObj[obj] = w
	b := encode(uint64(uintptr(unsafe.Pointer(w))), token)
	w.digest = metaDigest(obj, b)
	atomic.StoreUint64(&w.token, token)
	return b, nil
}

// newGuardChunk maps a new memfd for slots. A memfd, not anonymous memory,
// so that receivers can tell guard mappings from any other memory.
func newGuardChunk() ([]byte, error) {
	fd, err := unix.MemfdCreate(guardName, unix.MFD_CLOEXEC)
	if err != nil {
		return nil, transport.Errorf(transport.ErrNoMemory, "cma: memfd_create for guard words: %v", err)
	}
	defer unix.Close(fd) // the mapping keeps the memory
	if err := unix.Ftruncate(fd, guardChunk); err != nil {
		return nil, transport.Errorf(transport.ErrNoMemory, "cma: guard words: %v", err)
	}
	chunk, err := unix.Mmap(fd, 0, guardChunk, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, transport.Errorf(transport.ErrNoMemory, "cma: guard words: %v", err)
	}
	return chunk, nil
}

// release clears the object's slot before its memory goes back.
func (g *guardTable) release(obj transport.ObjectID) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if w, ok := g.byObj[obj]; ok {
		atomic.StoreUint64(&w.token, 0)
		w.digest = [sha256.Size]byte{}
		delete(g.byObj, obj)
		g.free = append(g.free, w)
	}
}

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
func (p *proc) exited() bool {
	if p.pidfd == nil {
		return false // no pidfd on this kernel: the start time check stands alone
	}
	rc, err := p.pidfd.SyscallConn()
	if err != nil {
		return true
	}
	gone := true
	err = rc.Control(func(fd uintptr) {
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		for {
			n, err := unix.Poll(fds, 0)
			if err == unix.EINTR {
				continue
			}
			gone = err != nil || n > 0
			return
		}
	})
	return err != nil || gone
}

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
		return nil, transport.Errorf(transport.ErrPeerUnavailable, "cma: source process %d is gone", pid)
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
			return nil, transport.Errorf(transport.ErrPeerUnavailable, "cma: source process %d is gone", pid)
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

// PeerGone drops the pidfd of a runtime that is gone: a receiver fed by
// many short-lived sources keeps no descriptor per source. Another runtime
// of the same process, if any, opens it again on its next fetch.
func (t *Transport) PeerGone(peer transport.PeerInfo) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for k := range t.procs {
		if k.pid == peer.Pid {
			t.forgetLocked(k)
		}
	}
}

// openSources is the number of source processes with a pidfd held.
func (t *Transport) openSources() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.procs)
}

// New makes the transport. On kernels where Yama restricts ptrace to
// descendants (ptrace_scope 1), it allows same-user processes to read this
// one, which is what classic ptrace permissions allow anyway; set
// RDT_CMA_SET_PTRACER=0 to keep the restriction (cma then fails with a
// message that names shm).
func New(h transport.Host) (transport.Transport, error) {
	st, err := processStartTime(os.Getpid())
	if err != nil {
		return nil, transport.Errorf(transport.ErrUnsupported, "cma: cannot read this process's start time from /proc: %v", err)
	}
	workers := h.Settings().CMAWorkers // RDT_CMA_WORKERS, checked by the runtime
	if workers < 1 || workers > maxWorkers {
		return nil, transport.Errorf(transport.ErrInvalidArgument, "%d workers: want 1 to %d", workers, maxWorkers)
	}
	t := &Transport{h: h, pid: os.Getpid(), startTime: st, workers: workers}
	if yamaScope() == 1 && h.Settings().CMASetPtracer {
		if err := unix.Prctl(unix.PR_SET_PTRACER, unix.PR_SET_PTRACER_ANY, 0, 0, 0); err != nil {
			h.Log().Warnf("cma: Yama ptrace_scope is 1 and PR_SET_PTRACER failed (%v): peers will fall back to shm", err)
		} else {
			h.Log().Infof("cma: Yama ptrace_scope is 1: allowed same-user processes to read this one")
		}
	}
	return t, nil
}

// Describe: cma reads another process's memory, so only on the same host
// (the host identity covers the pid namespace); the guard word the source
// clears at free is read after every copy; addresses are free to describe,
// so every put carries them; for host data it is the first choice.
func (t *Transport) Describe() transport.Descriptor {
	return transport.Descriptor{
		Name:                Name,
		Devices:             []transport.DeviceType{transport.DeviceCPU, transport.DeviceCUDAHost},
		OneSided:            true,
		CanAbort:            true,
		SameHostOnly:        true,
		DetectsFreedObjects: true,
		EagerMetadata:       true,
		Auto:                transport.AutoRank{Host: 10},
	}
}

// ExtractMetadata records where the tensors live in this process.
func (t *Transport) ExtractMetadata(obj transport.ObjectID, tensors []transport.Tensor) ([]byte, error) {
	m := metadata{Pid: uint32(t.pid), StartTime: t.startTime}
	for _, x := range tensors {
		if !x.Device.Type.HostAccessible() {
			return nil, transport.Errorf(transport.ErrUnsupported, "cma moves host memory; tensor on %s", x.Device)
		}
		m.Regions = append(m.Regions, region{Addr: uint64(x.Data), Size: x.Nbytes})
	}
	return t.guards.take(obj, func(guard, token uint64) []byte {
		m.Guard, m.Token = guard, token
		return m.encode()
	})
}

func (t *Transport) CommunicatorMetadata(x *transport.Transfer) ([]byte, error) { return nil, nil }

// GarbageCollect retires the object's guard slot, so that receivers still
// reading the memory find out.
func (t *Transport) GarbageCollect(obj transport.ObjectID, tensors []transport.Tensor, tmeta []byte) {
	t.guards.release(obj)
}

// Close drops every pidfd (those of requests still running once they end).
func (t *Transport) Close() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	for k := range t.procs {
		t.forgetLocked(k)
	}
	return nil
}

// Fetch checks the metadata against the targets and the source's guard
// slot, and starts reading.
func (t *Transport) Fetch(x *transport.Transfer, targets []transport.Tensor, tmeta, cmeta []byte) (transport.Request, error) {
	m, err := decodeMetadata(tmeta)
	if err != nil {
		return nil, err
	}
	// Ref bytes are checksummed, not signed: read no process but the owner
	// the control plane identified.
	if int(m.Pid) != x.Source.Pid {
		return nil, transport.Errorf(transport.ErrCorrupt,
			"cma: the metadata of object %s names process %d, but its owner %s is process %d: refusing to read another process's memory",
			x.Object, m.Pid, x.Source, x.Source.Pid)
	}
	if len(m.Regions) != len(targets) {
		return nil, transport.Errorf(transport.ErrInvalidArgument, "cma: the source describes %d tensors, %d targets given", len(m.Regions), len(targets))
	}
	var total uint64
	for i, r := range m.Regions {
		if r.Size != targets[i].Nbytes {
			return nil, transport.Errorf(transport.ErrInvalidArgument, "cma: tensor %d is %d bytes at the source, the target holds %d", i, r.Size, targets[i].Nbytes)
		}
		total += r.Size
	}
	src, err := t.source(int(m.Pid), m.StartTime)
	if err != nil {
		return nil, err
	}
	req := &request{Completion: transport.NewCompletion(), t: t, pid: int(m.Pid), startTime: m.StartTime, src: src, guard: m.Guard, token: m.Token}
	if err := req.checkSlot(x.Object, tmeta); err != nil {
		req.Release()
		return nil, err
	}
	if total <= syncLimit {
		req.Finish(req.copyChecked(m.Regions, targets, 1))
		return req, nil
	}
	go func() {
		req.Finish(req.copyChecked(m.Regions, targets, t.workers))
	}()
	return req, nil
}

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
	aborted   atomic.Bool
	released  sync.Once
}

// Release lets go of the source's process descriptor.
func (r *request) Release() { r.released.Do(func() { r.t.done(r.src) }) }

// span is one piece of work: a byte range of one tensor.
type span struct {
	remote, local uintptr
	n             uint64
}

// copyChecked copies, then makes sure the source lived through the copy:
// bytes read after it exited could come from a process that reused its pid.
func (r *request) copyChecked(regions []region, targets []transport.Tensor, workers int) error {
	err := r.copyAll(regions, targets, workers)
	if err != nil {
		return err
	}
	if r.src.exited() {
		return transport.Errorf(transport.ErrPeerUnavailable, "cma: source process %d exited during the transfer", r.pid)
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
		return transport.Errorf(transport.ErrPermissionDenied, "cma: cannot read the memory map of source process %d: %v; use the shm transport instead", r.pid, err)
	}
	if !ok {
		return transport.Errorf(transport.ErrCorrupt,
			"cma: the metadata of object %s names no guard slot of its owner (process %d): refusing to read addresses the owner did not put", obj, r.pid)
	}
	var b [slotRead]byte
	if err := r.readRemote(b[:], r.guard); err != nil {
		return err
	}
	if binary.LittleEndian.Uint64(b[:8]) != r.token {
		return transport.Errorf(transport.ErrPeerUnavailable, "cma: the source freed object %s (its runtime was destroyed, or the ref is stale)", obj)
	}
	if want := metaDigest(obj, tmeta); !bytes.Equal(b[8:], want[:]) {
		return transport.Errorf(transport.ErrCorrupt,
			"cma: the metadata of object %s is not what its owner (process %d) made for it: refusing to read addresses the owner did not put", obj, r.pid)
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
		return transport.Errorf(transport.ErrPeerUnavailable, "cma: the source's object is gone (its runtime was destroyed)")
	}
	if binary.LittleEndian.Uint64(b[:]) != r.token {
		return transport.Errorf(transport.ErrPeerUnavailable, "cma: the source freed the object while it was being read (its runtime was destroyed); the bytes are not used")
	}
	return nil
}

// copyAll reads every region into its target. Large tensors are cut into
// spans shared by up to `workers` goroutines.
func (r *request) copyAll(regions []region, targets []transport.Tensor, workers int) error {
	var spans []span
	for i, reg := range regions {
		if reg.Size == 0 {
			continue
		}
		parts := uint64(1)
		if reg.Size >= parallelMin && workers > 1 {
			parts = uint64(workers)
		}
		per := (reg.Size + parts - 1) / parts
		per = (per + 4095) &^ 4095 // page-aligned pieces
		for off := uint64(0); off < reg.Size; off += per {
			n := min(per, reg.Size-off)
			spans = append(spans, span{remote: uintptr(reg.Addr + off), local: targets[i].Data + uintptr(off), n: n})
		}
	}
	if len(spans) == 0 {
		return nil
	}
	if workers <= 1 || len(spans) == 1 {
		for _, s := range spans {
			if err := r.read(s); err != nil {
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
	for w := 0; w < min(workers, len(spans)); w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= len(spans) {
					return
				}
				if err := r.read(spans[i]); err != nil {
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

// read copies one span in chunks, checking for an abort between them.
func (r *request) read(s span) error {
	for done := uint64(0); done < s.n; {
		if r.aborted.Load() {
			return transport.Errorf(transport.ErrAborted, "cma: transfer aborted")
		}
		n := min(uint64(chunkSize), s.n-done)
		local := []unix.Iovec{{Base: (*byte)(unsafe.Pointer(s.local + uintptr(done)))}}
		local[0].SetLen(int(n))
		remote := []unix.RemoteIovec{{Base: s.remote + uintptr(done), Len: int(n)}}
		got, err := unix.ProcessVMReadv(r.pid, local, remote, 0)
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
		done += uint64(got)
	}
	return nil
}

// explain turns an errno into an error that says what happened and what to
// do about it.
func (r *request) explain(err error) error {
	switch {
	case errors.Is(err, unix.EPERM):
		return transport.Errorf(transport.ErrPermissionDenied,
			"cma: process_vm_readv of pid %d was refused (ptrace permission: Yama ptrace_scope %s, seccomp or a different user); use the shm transport instead",
			r.pid, yamaDescription())
	case errors.Is(err, unix.ENOSYS):
		return transport.Errorf(transport.ErrUnsupported, "cma: process_vm_readv is not available here (seccomp or an old kernel); use the shm transport instead")
	case errors.Is(err, unix.ESRCH):
		return transport.Errorf(transport.ErrPeerUnavailable, "cma: source process %d is gone", r.pid)
	}
	if alive := checkAlive(r.pid, r.startTime); alive != nil {
		return alive
	}
	return transport.Errorf(transport.ErrInternal, "cma: reading pid %d: %v (the source's memory is no longer mapped)", r.pid, err)
}

// checkAlive guards against a dead source and a recycled pid.
func checkAlive(pid int, startTime uint64) error {
	st, err := processStartTime(pid)
	if err != nil {
		return transport.Errorf(transport.ErrPeerUnavailable, "cma: source process %d is gone", pid)
	}
	if st != startTime {
		return transport.Errorf(transport.ErrPeerUnavailable, "cma: source process %d is gone (its pid now belongs to another process)", pid)
	}
	return nil
}

// processStartTime reads field 22 of /proc/<pid>/stat: the start time in
// clock ticks since boot, which with the pid names a process uniquely.
func processStartTime(pid int) (uint64, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	// The command name (field 2) may hold spaces and parentheses; the
	// fields after it start behind the last ')'.
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return 0, errors.New("malformed stat")
	}
	fields := strings.Fields(string(b[i+1:]))
	// fields[0] is field 3 (state), so field 22 is fields[19].
	if len(fields) < 20 {
		return 0, errors.New("short stat")
	}
	if fields[0] == "Z" || fields[0] == "X" {
		return 0, errors.New("process exited")
	}
	return strconv.ParseUint(fields[19], 10, 64)
}

func yamaScope() int {
	b, err := os.ReadFile("/proc/sys/kernel/yama/ptrace_scope")
	if err != nil {
		return -1
	}
	v, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return -1
	}
	return v
}

func yamaDescription() string {
	if s := yamaScope(); s >= 0 {
		return strconv.Itoa(s)
	}
	return "absent"
}

// ---- metadata ---------------------------------------------------------------

const (
	metaMagic   = "RCMA"
	metaVersion = 3
	maxRegions  = 1 << 16
	headerLen   = 4 + 1 + 4 + 8 + 8 + 8 + 4
	regionLen   = 16
)

type region struct{ Addr, Size uint64 }

// metadata is what a receiver needs: which process, where each tensor
// lives in it, and the object's guard slot. Layout (little endian): "RCMA",
// version u8, pid u32, start time u64, guard address u64, token u64,
// count u32, then count × (addr u64, size u64).
type metadata struct {
	Pid       uint32
	StartTime uint64
	Guard     uint64
	Token     uint64
	Regions   []region
}

func (m *metadata) encode() []byte {
	b := make([]byte, 0, headerLen+regionLen*len(m.Regions))
	b = append(b, metaMagic...)
	b = append(b, metaVersion)
	b = binary.LittleEndian.AppendUint32(b, m.Pid)
	b = binary.LittleEndian.AppendUint64(b, m.StartTime)
	b = binary.LittleEndian.AppendUint64(b, m.Guard)
	b = binary.LittleEndian.AppendUint64(b, m.Token)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(m.Regions)))
	for _, r := range m.Regions {
		b = binary.LittleEndian.AppendUint64(b, r.Addr)
		b = binary.LittleEndian.AppendUint64(b, r.Size)
	}
	return b
}

func decodeMetadata(b []byte) (*metadata, error) {
	bad := func(why string) error {
		return transport.Errorf(transport.ErrCorrupt, "cma: corrupt transport metadata (%s)", why)
	}
	if len(b) < headerLen {
		return nil, bad("too short")
	}
	if string(b[:4]) != metaMagic {
		return nil, bad("bad magic")
	}
	if b[4] != metaVersion {
		return nil, transport.Errorf(transport.ErrUnsupported, "cma: metadata version %d, this build reads version %d", b[4], metaVersion)
	}
	m := &metadata{
		Pid:       binary.LittleEndian.Uint32(b[5:]),
		StartTime: binary.LittleEndian.Uint64(b[9:]),
		Guard:     binary.LittleEndian.Uint64(b[17:]),
		Token:     binary.LittleEndian.Uint64(b[25:]),
	}
	n := binary.LittleEndian.Uint32(b[33:])
	if n > maxRegions {
		return nil, bad("too many tensors")
	}
	if uint64(len(b)-headerLen) != uint64(n)*regionLen {
		return nil, bad("length does not match the tensor count")
	}
	if m.Pid == 0 || m.Pid > 1<<22 {
		return nil, bad("pid out of range")
	}
	if m.Guard == 0 || m.Guard%slotSize != 0 || m.Token == 0 {
		return nil, bad("no guard word")
	}
	m.Regions = make([]region, n)
	for i := range m.Regions {
		p := b[headerLen+i*regionLen:]
		r := region{Addr: binary.LittleEndian.Uint64(p), Size: binary.LittleEndian.Uint64(p[8:])}
		if r.Addr+r.Size < r.Addr {
			return nil, bad("region wraps the address space")
		}
		m.Regions[i] = r
	}
	return m, nil
}
