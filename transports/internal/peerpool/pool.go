// Package peerpool keeps a receiver's idle connections to its peers, for
// the next fetch: at most a bound of them per key, each key belonging to
// one peer runtime, the most recently used taken first, and all of a
// peer's closed when the peer is gone.
package peerpool

import (
	"sync"
	"time"

	"github.com/rdt-project/rdt/core/transport"
)

// Config says how a Pool treats its connections.
type Config[K comparable, C any] struct {
	// Max is how many idle connections a key keeps; one put beyond it is
	// closed.
	Max int
	// Close closes a connection the pool gives up.
	Close func(C)
	// Peer is the runtime a key's connections lead to (DropPeer).
	Peer func(K) transport.RuntimeID
	// IdleTimeout closes a connection kept this long without use; zero
	// keeps it until it is taken, dropped or the pool closed.
	IdleTimeout time.Duration
}

// Pool is a set of idle connections by key. It is safe for concurrent use.
type Pool[K comparable, C any] struct {
	cfg Config[K, C]

	mu     sync.Mutex
	idle   map[K][]kept[C]
	reaper *time.Timer // closes connections idle too long; nil when none kept
	closed bool
}

type kept[C any] struct {
	c     C
	since time.Time
}

// New makes an empty pool.
func New[K comparable, C any](cfg Config[K, C]) *Pool[K, C] {
	return &Pool[K, C]{cfg: cfg, idle: map[K][]kept[C]{}}
}

// Take hands out the idle connection of k used last, if there is one.
func (p *Pool[K, C]) Take(k K) (C, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	l := p.idle[k]
	if len(l) == 0 {
		var none C
		return none, false
	}
	c := l[len(l)-1].c
	l[len(l)-1] = kept[C]{}
	if len(l) == 1 {
		delete(p.idle, k)
	} else {
		p.idle[k] = l[:len(l)-1]
	}
	return c, true
}

// Put keeps c as an idle connection of k, or closes it when the pool is
// closed or k keeps Max already.
func (p *Pool[K, C]) Put(k K, c C) {
	p.mu.Lock()
	if p.closed || len(p.idle[k]) >= p.cfg.Max {
		p.mu.Unlock()
		p.cfg.Close(c)
		return
	}
	p.idle[k] = append(p.idle[k], kept[C]{c: c, since: time.Now()})
	if p.cfg.IdleTimeout > 0 && p.reaper == nil {
		p.reaper = time.AfterFunc(p.cfg.IdleTimeout, p.reap)
	}
	p.mu.Unlock()
}

// Drop closes the idle connections of k.
func (p *Pool[K, C]) Drop(k K) {
	p.mu.Lock()
	l := p.idle[k]
	delete(p.idle, k)
	p.mu.Unlock()
	p.closeAll(l)
}

// DropPeer closes the idle connections of every key of peer.
func (p *Pool[K, C]) DropPeer(peer transport.RuntimeID) {
	var drop []kept[C]
	p.mu.Lock()
	for k, l := range p.idle {
		if p.cfg.Peer(k) == peer {
			drop = append(drop, l...)
			delete(p.idle, k)
		}
	}
	p.mu.Unlock()
	p.closeAll(drop)
}

// Close closes every idle connection; connections put later are closed
// at once.
func (p *Pool[K, C]) Close() {
	var drop []kept[C]
	p.mu.Lock()
	p.closed = true
	for k, l := range p.idle {
		drop = append(drop, l...)
		delete(p.idle, k)
	}
	if p.reaper != nil {
		p.reaper.Stop()
		p.reaper = nil
	}
	p.mu.Unlock()
	p.closeAll(drop)
}

// Len is the number of idle connections of k.
func (p *Pool[K, C]) Len(k K) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.idle[k])
}

// PeerLen is the number of idle connections of every key of peer.
func (p *Pool[K, C]) PeerLen(peer transport.RuntimeID) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for k, l := range p.idle {
		if p.cfg.Peer(k) == peer {
			n += len(l)
		}
	}
	return n
}

// Count is the number of idle connections kept.
func (p *Pool[K, C]) Count() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, l := range p.idle {
		n += len(l)
	}
	return n
}

// Idle lists the idle connections of k, the one Take hands out next last.
func (p *Pool[K, C]) Idle(k K) []C {
	p.mu.Lock()
	defer p.mu.Unlock()
	var cs []C
	for _, e := range p.idle[k] {
		cs = append(cs, e.c)
	}
	return cs
}

// Reaping reports whether a run of the idle timeout is scheduled.
func (p *Pool[K, C]) Reaping() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.reaper != nil
}

// reap closes the connections unused for the idle timeout, and runs again
// while any are left.
func (p *Pool[K, C]) reap() {
	now := time.Now()
	var drop []kept[C]
	p.mu.Lock()
	next := p.cfg.IdleTimeout
	for k, l := range p.idle {
		keep := l[:0]
		for _, e := range l {
			if age := now.Sub(e.since); age >= p.cfg.IdleTimeout {
				drop = append(drop, e)
			} else {
				keep = append(keep, e)
				next = min(next, p.cfg.IdleTimeout-age)
			}
		}
		clear(l[len(keep):])
		if len(keep) == 0 {
			delete(p.idle, k)
		} else {
			p.idle[k] = keep
		}
	}
	p.reaper = nil
	if len(p.idle) > 0 && !p.closed {
		p.reaper = time.AfterFunc(next, p.reap)
	}
	p.mu.Unlock()
	p.closeAll(drop)
}

func (p *Pool[K, C]) closeAll(l []kept[C]) {
	for _, e := range l {
		p.cfg.Close(e.c)
	}
}
