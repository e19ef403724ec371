package cma

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/rdt-project/rdt/core/transport"
	"golang.org/x/sys/unix"
)

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
		return nil, transport.Errorf(transport.ErrInternal, "%v", err)
	}
	token := binary.LittleEndian.Uint64(tb[:]) | 1 // never zero
	g.mu.Lock()
	defer g.mu.Unlock()
	// The core extracts an object's metadata once per transport.
	if _, ok := g.byObj[obj]; ok {
		return nil, transport.Errorf(transport.ErrInternal, "object %s already has metadata", obj)
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
		return nil, transport.Errorf(transport.ErrNoMemory, "memfd_create for guard words: %v", err)
	}
	defer unix.Close(fd) // the mapping keeps the memory
	if err := unix.Ftruncate(fd, guardChunk); err != nil {
		return nil, transport.Errorf(transport.ErrNoMemory, "guard words: %v", err)
	}
	chunk, err := unix.Mmap(fd, 0, guardChunk, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, transport.Errorf(transport.ErrNoMemory, "guard words: %v", err)
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

// ExtractMetadata records where the tensors live in this process.
func (t *Transport) ExtractMetadata(obj transport.ObjectID, tensors []transport.Tensor) ([]byte, error) {
	m := metadata{Pid: uint32(t.pid), StartTime: t.startTime}
	for _, x := range tensors {
		if !x.Device.Type.HostAccessible() {
			return nil, transport.Errorf(transport.ErrUnsupported, "it moves host memory; tensor on %s", x.Device)
		}
		m.Regions = append(m.Regions, region{Addr: uint64(x.Data), Size: x.Nbytes})
	}
	return t.guards.take(obj, func(guard, token uint64) []byte {
		m.Guard, m.Token = guard, token
		return m.encode()
	})
}

// GarbageCollect retires the object's guard slot, so that receivers still
// reading the memory find out.
func (t *Transport) GarbageCollect(obj transport.ObjectID, tensors []transport.Tensor, tmeta []byte) {
	t.guards.release(obj)
}
