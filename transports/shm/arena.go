package shm

import (
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/rdt-project/rdt/core/transport"
	"golang.org/x/sys/unix"
)

// The arena: one long-lived segment per source runtime that small objects
// are staged in, so that a receiver maps it once and reads every later
// object of that source without asking: no round trip, no descriptor to
// pass, check, map and close per fetch, which for small and mid-size
// objects cost more than the copy.
//
// Its start is a table of slots, one 64-bit tag each. An object staged in
// the arena gets a slot and a tag no object had before; the source stores
// the tag once the bytes are in place and stores 0 before the range is
// freed (and possibly reused). A receiver reads the slot, copies, and reads
// it again: the copy is the object's bytes only if the tag was the object's
// both times. The segment is sealed against shrinking and growing, so a
// receiver's mapping never faults; it is not sealed against writes (the
// source stages new objects into it), which the tag check covers.
const (
	arenaSlots     = 8192
	arenaTable     = arenaSlots * 8 // the tags, at the arena's start
	arenaAlign     = 64
	arenaObjectMax = 4 << 20 // larger objects get a segment of their own
	// maxArenaBytes bounds what a receiver maps of a source's word.
	maxArenaBytes = maxArenaMiB << 20
	// punchMin: freed ranges this large give their memory back at once.
	punchMin = 256 << 10
	// arenaRequest, as a request's inline limit, asks for the arena (the
	// request's object is the arena's id) instead of an object.
	arenaRequest = ^uint32(0)
)

// span is a free range of the arena.
type span struct{ off, size uint64 }

// arena is the source's side: the segment, mapped for writing, and what
// of it is free. Its methods are called with server.mu held.
type arena struct {
	id    transport.ObjectID // names it in requests and metadata
	fd    int
	mem   []byte
	free  []span   // by offset, never touching each other
	slots []uint32 // free slot numbers
	tags  uint64   // the last tag given
}

func newArena(size uint64) (*arena, error) {
	fd, err := unix.MemfdCreate("rdt-arena", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return nil, err
	}
	if err := unix.Ftruncate(fd, int64(size)); err != nil {
		unix.Close(fd)
		return nil, err
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK|unix.F_SEAL_GROW|unix.F_SEAL_SEAL); err != nil {
		unix.Close(fd)
		return nil, err
	}
	mem, err := unix.Mmap(fd, 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		unix.Close(fd)
		return nil, err
	}
	a := &arena{id: transport.ObjectID(transport.RandomID()), fd: fd, mem: mem,
		free: []span{{arenaTable, size - arenaTable}}}
	for s := arenaSlots - 1; s >= 0; s-- {
		a.slots = append(a.slots, uint32(s))
	}
	return a, nil
}

// alloc finds room for size bytes and a slot (first fit); false when the
// arena is full.
func (a *arena) alloc(size uint64) (slot uint32, tag, off uint64, ok bool) {
	need := (max(size, 1) + arenaAlign - 1) &^ (arenaAlign - 1)
	if len(a.slots) == 0 {
		return 0, 0, 0, false
	}
	for i, s := range a.free {
		if s.size < need {
			continue
		}
		off = s.off
		if s.size == need {
			a.free = append(a.free[:i], a.free[i+1:]...)
		} else {
			a.free[i] = span{s.off + need, s.size - need}
		}
		slot = a.slots[len(a.slots)-1]
		a.slots = a.slots[:len(a.slots)-1]
		a.tags++
		return slot, a.tags, off, true
	}
	return 0, 0, 0, false
}

// publish makes the bytes staged at a slot's range readable.
func (a *arena) publish(slot uint32, tag uint64) { atomic.StoreUint64(a.tag(slot), tag) }

// release retires the slot first, then frees its range for reuse.
func (a *arena) release(slot uint32, off, size uint64) {
	atomic.StoreUint64(a.tag(slot), 0)
	need := (max(size, 1) + arenaAlign - 1) &^ (arenaAlign - 1)
	if need >= punchMin {
		unix.Fallocate(a.fd, unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, int64(off), int64(need))
	}
	a.slots = append(a.slots, slot)
	i := 0
	for i < len(a.free) && a.free[i].off < off {
		i++
	}
	s := span{off, need}
	if i < len(a.free) && s.off+s.size == a.free[i].off { // joins the next
		s.size += a.free[i].size
		a.free = append(a.free[:i], a.free[i+1:]...)
	}
	if i > 0 && a.free[i-1].off+a.free[i-1].size == s.off { // joins the previous
		a.free[i-1].size += s.size
		return
	}
	a.free = append(a.free, span{})
	copy(a.free[i+1:], a.free[i:])
	a.free[i] = s
}

// close retires every slot, so that a receiver still mapping the arena
// reads no object from it, and lets the segment go.
func (a *arena) close() {
	for s := uint32(0); s < arenaSlots; s++ {
		atomic.StoreUint64(a.tag(s), 0)
	}
	unix.Munmap(a.mem)
	unix.Close(a.fd)
}

func (a *arena) tag(slot uint32) *uint64 { return (*uint64)(unsafe.Pointer(&a.mem[slot*8])) }

// receiverFD is a new descriptor of the arena for a receiver: one that
// cannot map it for writing, or, where /proc cannot reopen it read-only, a
// duplicate (receivers map it read-only either way, and only processes of
// the owner's user get it).
func (a *arena) receiverFD() (int, error) {
	if fd, err := unix.Open("/proc/self/fd/"+strconv.Itoa(a.fd), unix.O_RDONLY|unix.O_CLOEXEC, 0); err == nil {
		return fd, nil
	}
	return unix.FcntlInt(uintptr(a.fd), unix.F_DUPFD_CLOEXEC, 0)
}

// arenaView is a receiver's read-only mapping of one source's arena.
type arenaView struct {
	mu    sync.RWMutex // readers copy under RLock; unmap takes Lock
	mem   []byte       // nil once unmapped
	pidfd *os.File     // the owner process, to see it end; nil: use kill(0)
	pid   int
}

// mapArena checks and maps an arena descriptor the owner's segment server
// sent; it takes fd.
func mapArena(fd int, size uint64, owner int) (*arenaView, error) {
	defer unix.Close(fd)
	if size <= arenaTable || size > maxArenaBytes {
		return nil, transport.Errorf(transport.ErrCorrupt, "the source's arena is %d bytes (want %d to %d)", size, arenaTable+1, uint64(maxArenaBytes))
	}
	if err := checkSealedSize(fd, size, unix.F_SEAL_SHRINK|unix.F_SEAL_GROW, "arena", "sealed against resizing; refusing to map it"); err != nil {
		return nil, err
	}
	mem, err := unix.Mmap(fd, 0, int(size), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		if exhausted := outOfResources("mapping the source's arena", "this process", err); exhausted != nil {
			return nil, exhausted
		}
		return nil, transport.Errorf(transport.ErrTransport, "mapping the source's arena: %v", err)
	}
	v := &arenaView{mem: mem, pid: owner}
	if pidfd, err := unix.PidfdOpen(owner, 0); err == nil { // else an old kernel: kill(pid, 0)
		v.pidfd = os.NewFile(uintptr(pidfd), "pidfd")
	}
	return v, nil
}

// read copies an object staged in the arena into the targets. done is
// false when the arena cannot say (the object's slot does not hold it, or
// the view is unmapped): the segment server is asked then.
func (v *arenaView) read(m *metadata, targets []transport.Tensor) (done bool, err error) {
	v.mu.RLock()
	defer v.mu.RUnlock()
	if v.mem == nil {
		return false, nil
	}
	if v.ownerEnded() {
		return true, transport.Errorf(transport.ErrPeerUnavailable, "the owner of object %s (process %d) has ended", m.Object, v.pid)
	}
	size := uint64(len(v.mem))
	if m.Base > size || m.Size > size-m.Base {
		return true, transport.Errorf(transport.ErrCorrupt, "the metadata of object %s places it outside the source's arena", m.Object)
	}
	tag := (*uint64)(unsafe.Pointer(&v.mem[m.Slot*8]))
	if atomic.LoadUint64(tag) != m.Tag {
		return false, nil
	}
	copyRuns(v.mem[m.Base:m.Base+m.Size], m.Regions, targets)
	// The copy's reads come before the second look at the tag.
	var fence atomic.Uint64
	fence.Add(1)
	if atomic.LoadUint64(tag) != m.Tag {
		return false, nil
	}
	return true, nil
}

// copyRuns copies the regions of seg into the targets, one copy for each
// run of regions that follow each other both in seg and in memory (an
// object of many tensors fetched into one buffer is one copy).
func copyRuns(seg []byte, regions []region, targets []transport.Tensor) {
	for i := 0; i < len(regions); {
		from, to, n := regions[i].Offset, targets[i].Data, regions[i].Size
		j := i + 1
		for ; j < len(regions) && regions[j].Offset == from+n && targets[j].Data == to+uintptr(n); j++ {
			n += regions[j].Size
		}
		copy(transport.Bytes(to, n), seg[from:from+n])
		i = j
	}
}

// ownerEnded is whether the owner process is gone: its memory then holds
// no object, whatever its tags say.
func (v *arenaView) ownerEnded() bool {
	if v.pidfd == nil {
		return unix.Kill(v.pid, 0) == unix.ESRCH
	}
	return transport.ProcessExited(v.pidfd)
}

// unmap waits for readers to finish and lets the mapping go.
func (v *arenaView) unmap() {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.mem != nil {
		unix.Munmap(v.mem)
		v.mem = nil
	}
	if v.pidfd != nil {
		v.pidfd.Close()
		v.pidfd = nil
	}
}
