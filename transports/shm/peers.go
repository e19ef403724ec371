package shm

import (
	"net"
	"sync"
	"time"

	"github.com/rdt-project/rdt/core/transport"
	"github.com/rdt-project/rdt/transports/internal/peerpool"
)

// peers is what a runtime keeps for the segment servers of other runtimes
// it fetches from, views or writes to: per runtime a record (keptConns)
// with the arena mapped from it, and the idle connections to its server,
// all let go of when that runtime is gone (drop).
type peers struct {
	mu   sync.Mutex
	idle map[transport.RuntimeID]*keptConns // by source runtime; nil once closed
	// kept holds the idle connections of the records in idle, by source
	// runtime and socket path (under mu, so that a record and its
	// connections go together).
	kept *peerpool.Pool[keptKey, *net.UnixConn]
	// wkept holds the idle connections writes moved on, with their
	// staging areas mapped, like kept (see write.go).
	wkept *peerpool.Pool[keptKey, *wconn]
}

// keptConns is a receiver's record of one source runtime: its idle
// connections to the runtime's segment server (in peers.kept), kept
// for the next request, and the arena mapped from it, all closed when
// that runtime is gone (peers.drop). A connection that comes back to a
// record no longer in peers.idle is closed.
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

func newPeers() *peers {
	return &peers{
		idle: map[transport.RuntimeID]*keptConns{},
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
		}),
	}
}

// record is the record of the connections kept to a source runtime.
func (p *peers) record(peer transport.PeerInfo) (*keptConns, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.idle == nil {
		return nil, transport.Errorf(transport.ErrClosed, "the transport is closed")
	}
	k := p.idle[peer.RuntimeID]
	if k == nil {
		// Records that keep nothing go, should a source's end have been
		// reported before its first fetch started.
		for id, other := range p.idle {
			if p.keepsNothingLocked(other) {
				delete(p.idle, id)
			}
		}
		k = &keptConns{peer: peer.RuntimeID, arenas: map[transport.ObjectID]*arenaView{}}
		p.idle[peer.RuntimeID] = k
	}
	return k, nil
}

// keepsNothingLocked reports whether a record holds no arena and no
// connection; the caller holds mu.
func (p *peers) keepsNothingLocked(k *keptConns) bool {
	return len(k.arenas) == 0 && p.kept.PeerLen(k.peer) == 0 && p.wkept.PeerLen(k.peer) == 0
}

// liveLocked reports whether src is still the record of its runtime (not
// dropped, nor the transport closed); the caller holds mu.
func (p *peers) liveLocked(src *keptConns) bool {
	return p.idle != nil && p.idle[src.peer] == src
}

// mappedArena is the arena id of the source, when this receiver mapped it.
func (p *peers) mappedArena(src *keptConns, id transport.ObjectID) *arenaView {
	p.mu.Lock()
	defer p.mu.Unlock()
	return src.arenas[id]
}

// keepArena records v as src's arena id, mapped. kept is false when src's
// record was dropped meanwhile (nothing would unmap v later: the caller
// does); a view another fetch mapped meanwhile is returned instead of v,
// which is unmapped.
func (p *peers) keepArena(src *keptConns, id transport.ObjectID, v *arenaView) (_ *arenaView, kept bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.liveLocked(src) {
		return v, false
	}
	if mapped := src.arenas[id]; mapped != nil { // by another fetch meanwhile
		v.unmap()
		return mapped, true
	}
	src.arenas[id] = v
	return v, true
}

// takeIdle takes a connection kept for src's segment server at path (a
// record dropped meanwhile has none).
func (p *peers) takeIdle(src *keptConns, path string) *net.UnixConn {
	c, _ := take(p, p.kept, src, path)
	return c
}

// keepIdle keeps c for the next request to the segment server at path,
// unless src's record was dropped or keeps maxIdle for that path already.
func (p *peers) keepIdle(src *keptConns, path string, c *net.UnixConn) {
	keep(p, p.kept, src, path, c, func(c *net.UnixConn) { c.Close() })
}

// takeWriteConn takes a connection a write to src's segment server at path
// moved on before (a record dropped meanwhile has none).
func (p *peers) takeWriteConn(src *keptConns, path string) (*wconn, bool) {
	return take(p, p.wkept, src, path)
}

// keepWriteConn keeps w for the next write to the segment server at path,
// unless src's record was dropped.
func (p *peers) keepWriteConn(src *keptConns, path string, w *wconn) {
	keep(p, p.wkept, src, path, w, (*wconn).close)
}

// take takes a connection kept in pool, one of p's, for src's segment
// server at path; a record dropped meanwhile has none.
func take[C any](p *peers, pool *peerpool.Pool[keptKey, C], src *keptConns, path string) (c C, ok bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.liveLocked(src) {
		return c, false
	}
	return pool.Take(keptKey{peer: src.peer, path: path})
}

// keep keeps c in pool, one of p's, for the next request to src's segment
// server at path, or closes it when src's record was dropped (or the pool
// holds its most for that path).
func keep[C any](p *peers, pool *peerpool.Pool[keptKey, C], src *keptConns, path string, c C, close func(C)) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.liveLocked(src) {
		close(c)
		return
	}
	pool.Put(keptKey{peer: src.peer, path: path}, c)
}

// drop lets go of what is kept for a runtime that is gone.
func (p *peers) drop(peer transport.RuntimeID) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if k := p.idle[peer]; k != nil {
		k.unmapLocked()
		delete(p.idle, peer)
	}
	p.kept.DropPeer(peer)
	p.wkept.DropPeer(peer)
}

// close lets go of everything kept; what comes back later is closed.
func (p *peers) close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, k := range p.idle {
		k.unmapLocked()
	}
	p.idle = nil // keepIdle closes what comes back later
	p.kept.Close()
	p.wkept.Close()
}

// unmapLocked unmaps the source's arena; the caller holds peers.mu.
func (k *keptConns) unmapLocked() {
	for id, v := range k.arenas {
		v.unmap()
		delete(k.arenas, id)
	}
}

// count is the number of idle connections kept, for tests.
func (p *peers) count() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.kept.Count()
}
