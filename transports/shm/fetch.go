package shm

import (
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rdt-project/rdt/core/transport"
	"golang.org/x/sys/unix"
)

// receiver is a runtime's side as a peer that fetches and views other
// runtimes' objects, over what it keeps for their segment servers.
type receiver struct {
	h     transport.Host
	peers *peers
}

func (t *Transport) CommunicatorMetadata(x *transport.Transfer) ([]byte, error) { return nil, nil }

// request is a fetch in progress: it completes when the copy ends.
type request struct {
	*transport.Completion
	aborted atomic.Bool
	// asking is the connection waiting for the segment server's answer,
	// which a stopped source would hold for ioTimeout: Abort cuts it short.
	mu     sync.Mutex
	asking *net.UnixConn
}

// Abort makes the copy stop at its next chunk, and a wait for the segment
// server's answer stop now.
func (t *Transport) Abort(x *transport.Transfer, req transport.Request) {
	switch r := req.(type) {
	case *writeRequest:
		r.abort()
	case *request:
		r.abort()
	}
}

func (r *request) abort() {
	r.aborted.Store(true)
	r.mu.Lock()
	if r.asking != nil {
		r.asking.SetDeadline(time.Now())
	}
	r.mu.Unlock()
}

// ask records c as the connection the request waits on (nil: none); a
// request already aborted finds c's deadline passed.
func (r *request) ask(c *net.UnixConn) {
	if r == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.asking = c
	if c != nil && r.aborted.Load() {
		c.SetDeadline(time.Now())
	}
}

// Fetch checks the metadata against the transfer and the targets, and
// starts copying.
func (t *Transport) Fetch(x *transport.Transfer, targets []transport.Tensor, tmeta, cmeta []byte) (transport.Request, error) {
	return t.rcv.fetch(x, targets, tmeta)
}

// fetch is Fetch.
func (rcv *receiver) fetch(x *transport.Transfer, targets []transport.Tensor, tmeta []byte) (transport.Request, error) {
	m, err := checkTransfer(x, targets, tmeta)
	if err != nil {
		return nil, err
	}
	if x.Pieces != nil {
		m.takePieces(x.Pieces)
	}
	owner := x.Owner()
	src, err := rcv.peers.record(owner)
	if err != nil {
		return nil, err
	}
	r := &request{Completion: transport.NewCompletion()}
	if m.inArena() {
		// With the source's arena mapped, the object is read here and
		// now, asking nothing; else the arena is asked for (once per
		// source) on a goroutine, where Abort reaches the wait.
		if v := rcv.peers.mappedArena(src, m.Arena); v != nil {
			if done, err := v.read(m, targets); done {
				r.Finish(err)
				return r, nil
			}
		}
		go func() { r.Finish(rcv.fetchFromArena(r, src, owner.Pid, m, targets)) }()
		return r, nil
	}
	if m.Size <= inlineMax {
		// A small object is asked for here and, when its answer comes
		// within syncWait, finished on the caller's goroutine (the engine
		// then needs no hand-off, which costs more than the copy). A
		// slower answer is waited for on a goroutine, where Abort reaches
		// it.
		a, err := rcv.getSegment(r, src, owner.Pid, m, targets, true)
		if a.pending == nil {
			r.Finish(r.check(a, err, m, targets))
			return r, nil
		}
		go func() {
			a, err := rcv.resume(r, src, owner.Pid, m, targets, a.pending)
			r.Finish(r.check(a, err, m, targets))
		}()
		return r, nil
	}
	// Larger objects are read on a goroutine, so that a fetch of many refs
	// overlaps their socket round trips and copies.
	go func() {
		a, err := rcv.getSegment(r, src, owner.Pid, m, targets, false)
		r.Finish(r.check(a, err, m, targets))
	}()
	return r, nil
}

// checkTransfer is what a fetch and a write check before anything moves:
// the metadata decodes and names the object of the transfer, and the local
// tensors (a fetch's targets, a write's sources) fit it and lie in host
// memory. Ref bytes are checksummed, not signed: the metadata must name the
// object (its segment holds nothing else), and the segment server must be
// its owner's process (checked at connect).
func checkTransfer(x *transport.Transfer, local []transport.Tensor, tmeta []byte) (*metadata, error) {
	m, err := decodeMetadata(tmeta)
	if err != nil {
		return nil, err
	}
	if m.Object != x.Object {
		return nil, transport.Errorf(transport.ErrCorrupt, "the metadata of object %s names object %s: refusing it", x.Object, m.Object)
	}
	if err := x.CheckPieces(local, len(m.Regions), func(i int) uint64 { return m.Regions[i].Size }); err != nil {
		return nil, err
	}
	what := "target"
	if x.Direction == transport.Write {
		what = "source"
	}
	for i, tg := range local {
		if !tg.Device.Type.HostAccessible() {
			return nil, transport.Errorf(transport.ErrUnsupported, "%s %d is in %s memory; shm moves host memory", what, i, tg.Device)
		}
	}
	return m, nil
}

// fetchFromArena maps the source's arena if need be and reads the object
// from it. When the arena's slot does not hold the object, the segment
// server says why: freed (NOT_FOUND), or metadata that is not this
// object's (CORRUPT); a source that is gone is PEER_UNAVAILABLE.
func (rcv *receiver) fetchFromArena(r *request, src *keptConns, owner int, m *metadata, targets []transport.Tensor) error {
	v, kept, err := rcv.arenaFor(r, src, owner, m)
	if err != nil {
		return r.check(answer{fd: -1}, err, m, targets)
	}
	if !kept {
		defer v.unmap()
	}
	if done, err := v.read(m, targets); done {
		return err
	}
	a, err := rcv.getSegment(r, src, owner, m, nil, false)
	if err == nil {
		if a.fd >= 0 {
			unix.Close(a.fd)
		}
		err = transport.Errorf(transport.ErrCorrupt, "the owner's segment server answered for object %s of its arena as if it had a segment of its own", m.Object)
	}
	return r.check(answer{fd: -1}, err, m, targets)
}

// arenaFor is the view of the arena m names: the one mapped, or one mapped
// now after asking the source's segment server for it (which hands out
// only its own). kept is false for a view mapped for this fetch alone: the
// source's record was dropped meanwhile (the source reported gone, or the
// record pruned as empty), so nothing would unmap it later; the caller
// unmaps it.
func (rcv *receiver) arenaFor(r *request, src *keptConns, owner int, m *metadata) (v *arenaView, kept bool, err error) {
	if v := rcv.peers.mappedArena(src, m.Arena); v != nil {
		return v, true, nil
	}
	a, err := rcv.getSegment(r, src, owner, &metadata{Path: m.Path, Object: m.Arena, askArena: true}, nil, false)
	if err != nil {
		return nil, false, err
	}
	if a.fd < 0 {
		return nil, false, transport.Errorf(transport.ErrCorrupt, "the owner's segment server sent no descriptor for its arena")
	}
	v, err = mapArena(a.fd, a.size, owner)
	if err != nil {
		return nil, false, err
	}
	v, kept = rcv.peers.keepArena(src, m.Arena, v)
	return v, kept, nil
}

// check finishes a fetch once the segment server answered: nothing more
// for an object that came inline (fd -1), else the received segment is
// checked and read.
func (r *request) check(a answer, err error, m *metadata, targets []transport.Tensor) error {
	if err != nil {
		if r.aborted.Load() && transport.StatusOf(err) != transport.ErrAborted {
			return transport.Errorf(transport.ErrAborted, "transfer aborted while the owner's segment server was asked: %v", err)
		}
		return err
	}
	if a.fd < 0 { // it came inline, straight into the targets
		return nil
	}
	fd, size := a.fd, a.size
	defer unix.Close(fd)
	if size != m.Size {
		return transport.Errorf(transport.ErrCorrupt, "the source's segment holds %d bytes, its metadata says %d", size, m.Size)
	}
	if err := checkSealedSize(fd, size, unix.F_SEAL_WRITE|unix.F_SEAL_SHRINK, "segment", "sealed against writes and shrinking; refusing to read it"); err != nil {
		return err
	}
	return readRegions(fd, m.Regions, targets, &r.aborted)
}
