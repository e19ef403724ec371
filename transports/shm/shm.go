// Package shm moves host memory between processes on one host through
// shared memory: the source stages an object once, into its arena (one
// long-lived memfd for objects of up to 4 MiB, which a receiver maps once
// and then reads without asking; see arena.go) or into a sealed memfd of
// its own, whose descriptor a receiver gets over a Unix socket
// (SCM_RIGHTS) and reads into its targets. Memfds have no name in any file
// system, so nothing is ever left in /dev/shm, even after a crash.
package shm

import (
	"net"
	"sync"
	"time"

	"github.com/rdt-project/rdt/core/transport"
	"github.com/rdt-project/rdt/transports/internal/peerpool"
	"golang.org/x/sys/unix"
)

// Name is the canonical transport name.
const Name = "shm"

const (
	align = 64 // tensors start on cache-line boundaries in a segment
	// chunk is copied between checks for an abort.
	chunk = 4 << 20
	// parallelMin: copies at least this large are split between workers.
	parallelMin = 32 << 20
	workers     = 2
	dialTimeout = 5 * time.Second
	ioTimeout   = 30 * time.Second
	// A segment-server connection is kept for the next request; the
	// server closes one idle this long, and a receiver keeps at most
	// maxIdle per segment server of a source.
	idleTimeout = 60 * time.Second
	maxIdle     = 16
	// inlineMax: objects up to this size travel inline on the kept
	// connection instead of as a descriptor (see answer). Measured: inline
	// is faster at 4 and 16 KiB; at 64 KiB the source's extra copy costs
	// more than the descriptor saves.
	inlineMax = 16 << 10
	// syncWait: how long Fetch waits for a small object's answer before
	// it leaves the wait to a goroutine.
	syncWait = 2 * time.Millisecond
	// hotWait: how long a thread of the segment server waits for the next
	// request on a connection it just answered, before it leaves the wait
	// to the runtime's poller (and frees the thread).
	hotWait = 5 * time.Millisecond
)

// Factory makes the transport for a new runtime.
func Factory() transport.TransportFactory {
	return transport.TransportFactory{Name: Name, New: New, Settings: Settings()}
}

// segment is one staged object: a sealed memfd of its own, or a range of
// the arena (fd -1).
type segment struct {
	fd   int
	size uint64
	meta []byte // what ExtractMetadata said of it

	// In the arena:
	slot uint32
	off  uint64
	view int // a sealed copy of the range for views (view.go); -1: none yet
}

func (s *segment) inArena() bool { return s.fd < 0 }

// Transport is the shm transport of one runtime.
type Transport struct {
	h transport.Host

	mu      sync.RWMutex // segs: readers serve, writers stage and free
	segs    map[transport.ObjectID]*segment
	ln      *net.UnixListener
	path    string
	serving sync.WaitGroup
	conns   map[*net.UnixConn]struct{} // served connections, closed by Close
	closed  bool
	// arena stages small objects (made at the first); arenaBytes is its
	// size, 0 for none.
	arena      *arena
	arenaBytes uint64

	idleMu sync.Mutex
	idle   map[transport.RuntimeID]*keptConns // by source runtime; nil once closed
	// kept holds the idle connections of the records in idle, by source
	// runtime and socket path (under idleMu, so that a record and its
	// connections go together).
	kept *peerpool.Pool[keptKey, *net.UnixConn]
	// wkept holds the idle connections writes moved on, with their
	// staging areas mapped, like kept (see write.go).
	wkept *peerpool.Pool[keptKey, *wconn]
}

// keptConns is a receiver's record of one source runtime: its idle
// connections to the runtime's segment server (in Transport.kept), kept
// for the next request, and the arena mapped from it, all closed when
// that runtime is gone (PeerGone). A connection that comes back to a
// record no longer in Transport.idle is closed.
type keptConns struct {
	peer transport.RuntimeID
	// arenas mapped, by id: the source runtime's one (only a segment
	// server that has an arena hands it out, one per server).
	arenas map[transport.ObjectID]*arenaView
}

// keptKey names the idle connections to one segment server of a source.
type keptKey struct {
	peer transport.RuntimeID
	path string
}

// New makes the transport; its socket appears with the first staged object.
func New(h transport.Host) (transport.Transport, error) {
	return &Transport{h: h, segs: map[transport.ObjectID]*segment{}, conns: map[*net.UnixConn]struct{}{},
		idle: map[transport.RuntimeID]*keptConns{}, arenaBytes: uint64(arenaSetting.In(h.Settings())) << 20,
		kept: peerpool.New(peerpool.Config[keptKey, *net.UnixConn]{
			Max:   maxIdle,
			Close: func(c *net.UnixConn) { c.Close() },
			Peer:  func(k keptKey) transport.RuntimeID { return k.peer },
		}),
		wkept: peerpool.New(peerpool.Config[keptKey, *wconn]{
			Max:   maxIdle,
			Close: func(w *wconn) { w.close() },
			Peer:  func(k keptKey) transport.RuntimeID { return k.peer },
			// Before the server closes it: its staging area is unmapped
			// on this side too.
			IdleTimeout: idleTimeout - 10*time.Second,
		})}, nil
}

// Describe: shm shares memory segments, so only on the same host; a freed
// object's segment is no longer handed out; a partial fetch reads only its
// pieces from the segment or arena; staging costs a copy, so
// objects put without a transport are staged only when a fetch asks for
// shm (no eager metadata); for host data it comes after cma.
func (t *Transport) Describe() transport.Descriptor {
	return transport.Descriptor{
		Name:                Name,
		Devices:             []transport.DeviceType{transport.DeviceCPU, transport.DeviceCUDAHost},
		OneSided:            true,
		CanAbort:            true,
		SameHostOnly:        true,
		DetectsFreedObjects: true,
		Ranges:              true,
		Auto:                transport.AutoRank{Host: 20},
		Writes:              true,
	}
}

// Close stops serving and frees every segment.
func (t *Transport) Close() error {
	t.mu.Lock()
	t.closed = true
	ln := t.ln
	for id, s := range t.segs {
		if !s.inArena() {
			unix.Close(s.fd)
		}
		if s.view >= 0 {
			unix.Close(s.view)
		}
		delete(t.segs, id)
	}
	if t.arena != nil {
		t.arena.close() // receivers still mapping it read nothing more from it
		t.arena = nil
	}
	for c := range t.conns {
		transport.CloseWaking(c) // a served connection waiting for its next request
	}
	t.mu.Unlock()
	if ln != nil {
		ln.Close() // also removes the socket file
	}
	t.serving.Wait()
	t.idleMu.Lock()
	for _, k := range t.idle {
		k.unmapLocked()
	}
	t.idle = nil // keepIdle closes what comes back later
	t.kept.Close()
	t.wkept.Close()
	t.idleMu.Unlock()
	return nil
}

// PeerGone closes the connections kept to a source runtime that is gone:
// a receiver fed by many short-lived sources keeps no socket per source.
func (t *Transport) PeerGone(peer transport.PeerInfo) {
	t.idleMu.Lock()
	defer t.idleMu.Unlock()
	if k := t.idle[peer.RuntimeID]; k != nil {
		k.unmapLocked()
		delete(t.idle, peer.RuntimeID)
	}
	t.kept.DropPeer(peer.RuntimeID)
	t.wkept.DropPeer(peer.RuntimeID)
}

// unmapLocked unmaps the source's arena; the caller holds idleMu.
func (k *keptConns) unmapLocked() {
	for id, v := range k.arenas {
		v.unmap()
		delete(k.arenas, id)
	}
}

// keptCount is the number of idle connections kept, for tests.
func (t *Transport) keptCount() int {
	t.idleMu.Lock()
	defer t.idleMu.Unlock()
	return t.kept.Count()
}
