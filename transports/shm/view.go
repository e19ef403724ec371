package shm

import (
	"net"
	"time"
	"unsafe"

	"github.com/rdt-project/rdt/core/transport"
	"golang.org/x/sys/unix"
)

// viewRequest, as a request's inline limit, asks for a descriptor of the
// object's own sealed segment, to map (see View): never inline, never the
// arena, whose ranges are reused once their objects are freed.
const viewRequest = arenaRequest - 1

// viewSeals are what a segment must carry before it is mapped: nothing can
// write it (so every reader sees the bytes of the put, whatever the owner
// does) or shrink it (a mapping past its end faults with SIGBUS).
const viewSeals = unix.F_SEAL_WRITE | unix.F_SEAL_SHRINK

// mapping is an object's segment mapped into this process.
type mapping struct {
	mem   []byte // nil for an object of no bytes
	data  []uintptr
	sizes []uint64
}

func (v *mapping) Data() []uintptr { return v.data }
func (v *mapping) Sizes() []uint64 { return v.sizes }

func (v *mapping) Close() error {
	if v.mem == nil {
		return nil
	}
	err := unix.Munmap(v.mem)
	v.mem = nil
	if err != nil {
		return transport.Errorf(transport.ErrInternal, "munmap: %v", err)
	}
	return nil
}

// View maps the object's sealed segment: read-only and shared, or (private)
// copy-on-write, so that writes stay in this process. The descriptor comes
// from the owner's segment server, which must be the owner's process and
// hands out only the sealed segment of an object it still holds; the
// mapping keeps the segment's memory after the owner freed the object or
// died, and its bytes cannot change.
func (t *Transport) View(x *transport.Transfer, tmeta []byte, private bool, deadline time.Time) (transport.Mapping, error) {
	return t.rcv.view(x, tmeta, private, deadline)
}

// view is View.
func (rcv *receiver) view(x *transport.Transfer, tmeta []byte, private bool, deadline time.Time) (transport.Mapping, error) {
	m, err := decodeMetadata(tmeta)
	if err != nil {
		return nil, err
	}
	if m.Object != x.Object {
		return nil, transport.Errorf(transport.ErrCorrupt, "the metadata of object %s names object %s: refusing it", x.Object, m.Object)
	}
	if x.Pieces != nil {
		return nil, transport.Errorf(transport.ErrInvalidArgument, "a view maps whole objects; a partial view is a slice of one")
	}
	owner := x.Owner()
	src, err := rcv.peers.record(owner)
	if err != nil {
		return nil, err
	}
	r := &request{Completion: transport.NewCompletion()}
	if !deadline.IsZero() {
		// The wait for the owner's answer ends at the deadline, as Abort
		// ends a fetch's.
		stop := time.AfterFunc(time.Until(deadline), r.abort)
		defer stop.Stop()
	}
	ask := &metadata{Path: m.Path, Object: m.Object, Size: m.Size, askView: true}
	a, err := rcv.getSegment(r, src, owner.Pid, ask, nil, false)
	if err != nil {
		if r.aborted.Load() {
			return nil, transport.Errorf(transport.ErrTimeout, "the view's deadline passed while the owner's segment server was asked: %v", err)
		}
		return nil, err
	}
	if a.fd < 0 {
		return nil, transport.Errorf(transport.ErrCorrupt, "the owner's segment server sent no descriptor for a view of object %s", m.Object)
	}
	defer unix.Close(a.fd) // the mapping keeps the memory
	if a.size != m.Size {
		return nil, transport.Errorf(transport.ErrCorrupt, "the source's segment holds %d bytes, its metadata says %d", a.size, m.Size)
	}
	if err := checkSealedSize(a.fd, a.size, viewSeals, "segment", "sealed against writes and shrinking; refusing to map it"); err != nil {
		return nil, err
	}
	v := &mapping{data: make([]uintptr, len(m.Regions)), sizes: make([]uint64, len(m.Regions))}
	for i, g := range m.Regions {
		v.sizes[i] = g.Size
	}
	if m.Size == 0 {
		return v, nil
	}
	prot, flags := unix.PROT_READ, unix.MAP_SHARED
	if private {
		prot, flags = unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE
	}
	mem, err := unix.Mmap(a.fd, 0, int(m.Size), prot, flags)
	if err != nil {
		if exhausted := outOfResources("mapping the segment", "this process", err); exhausted != nil {
			return nil, exhausted
		}
		return nil, transport.Errorf(transport.ErrTransport, "mapping a %d-byte segment: %v", m.Size, err)
	}
	v.mem = mem
	base := uintptr(unsafe.Pointer(&mem[0]))
	for i, g := range m.Regions {
		// decodeMetadata checked each region against the metadata's size,
		// which is the segment's and the mapping's: checked again here, as
		// a reader faults on anything past the mapping.
		if g.Offset > uint64(len(mem)) || g.Size > uint64(len(mem))-g.Offset {
			v.Close()
			return nil, transport.Errorf(transport.ErrCorrupt, "tensor %d, bytes [%d, +%d), lies outside the %d-byte segment", i, g.Offset, g.Size, len(mem))
		}
		v.data[i] = base + uintptr(g.Offset)
	}
	return v, nil
}

// answerView hands a receiver the descriptor a view of obj maps.
func (srv *server) answerView(c *net.UnixConn, obj transport.ObjectID) bool {
	fd, size, err := srv.viewFD(obj)
	if err != nil {
		return refuse(c, err)
	}
	return sendFD(c, fd, size)
}

// viewFD is a duplicate of the sealed segment a view of obj maps: the
// object's own, or for an object of the arena a sealed copy of its range,
// made at its first view and dropped with the object.
func (srv *server) viewFD(obj transport.ObjectID) (int, uint64, error) {
	srv.mu.RLock()
	s, ok := srv.segs[obj]
	if !ok {
		srv.mu.RUnlock()
		return -1, 0, notStaged(obj)
	}
	if s.inArena() && s.view < 0 {
		// The copy is made under the read lock: GarbageCollect, which
		// would release the range, waits for it.
		a := srv.arena
		var fd int
		var err error
		if a == nil {
			err = transport.Errorf(transport.ErrClosed, "the transport is closed")
		} else {
			whole := transport.Tensor{TensorDesc: transport.TensorDesc{Nbytes: s.size}, Data: uintptr(unsafe.Pointer(&a.mem[s.off]))}
			fd, err = stage(obj, []transport.Tensor{whole}, []region{{Size: s.size}}, s.size)
		}
		srv.mu.RUnlock()
		if err != nil {
			return -1, 0, err
		}
		srv.mu.Lock()
		if cur, ok := srv.segs[obj]; !ok || cur != s || s.view >= 0 {
			unix.Close(fd) // freed, or copied by another view meanwhile
		} else {
			s.view = fd
		}
		srv.mu.Unlock()
		return srv.viewFD(obj)
	}
	src := s.fd
	if s.inArena() {
		src = s.view
	}
	// A duplicate: GarbageCollect may close the original meanwhile.
	fd, err := unix.FcntlInt(uintptr(src), unix.F_DUPFD_CLOEXEC, 0)
	size := s.size
	srv.mu.RUnlock()
	if err != nil {
		return -1, 0, handOutError("the segment", err)
	}
	return fd, size, nil
}
