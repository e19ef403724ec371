package cudaipc

import (
	"container/list"
	"sync"
	"time"

	"github.com/rdt-project/rdt/core/transport"
	"github.com/rdt-project/rdt/transports/internal/cuda"
)

// The receiver's cache of opened IPC handles.
//
// Opening a handle (cuIpcOpenMemHandle) maps the source's allocation and
// costs far more than a small copy, and caching allocators (PyTorch's) put
// many tensors in one allocation and reuse it for the life of the process,
// so opened handles are kept and reused. Nothing tells a receiver when the
// source frees an allocation: the source's garbage_collect runs in the
// source. A stale entry can never be used for a new allocation (a new
// allocation gets a new handle, and the key is the handle's bytes), so the
// only cost of keeping one is the mapping itself, which can keep the freed
// device memory of the source alive. Entries are therefore closed when
//   - they have not been used for idleTimeout (checked every sweepEvery),
//   - the cache holds more than its limit (least recently used first),
//   - the source runtime is gone (the core's peer-gone notice),
//   - the source process has exited (checked by the sweep), or
//   - the last transport of the process is closed.
// An entry in use by a request is never closed before the request releases it.
//
// The cache is one per process, shared by every runtime's transport, and
// keyed by the device the handle is opened on as well: one handle may be
// opened in the contexts of several devices (a mapping in each), but must
// not be opened twice in one context.
//
// An allocation of virtual memory management (vmm.go) is cached the same
// way, keyed by its chunks' export ids instead of a handle (a key with
// chunks set never equals a legacy handle's); its entry unmaps the chunks
// and frees the address range when closed. A stale entry cannot serve a
// new allocation either: the source numbers every export anew.

const (
	idleTimeout = 30 * time.Second
	sweepEvery  = time.Second
)

type cacheKey struct {
	source transport.RuntimeID
	handle cuda.IPCHandle // a legacy allocation's (zero for VMM)
	chunks string         // a VMM allocation's export ids (vmmKey; "" for legacy)
	dev    int            // ordinal of the device whose context opens the handle
}

type entry struct {
	key     cacheKey
	ptr     cuda.Ptr     // the mapping's base in this process
	unmap   func() error // closes a VMM mapping (nil: a legacy handle's, closed with the cache's close)
	pid     int          // source process
	refs    int          // requests using the mapping
	lastUse time.Time
	elem    *list.Element
	dead    bool // removed from the cache; close once refs reaches 0
}

type handleCache struct {
	open  func(dev int, h cuda.IPCHandle) (cuda.Ptr, error)
	close func(dev int, p cuda.Ptr) error
	alive func(pid int) bool
	now   func() time.Time
	warn  func(format string, args ...any)

	mu       sync.Mutex
	limit    int
	m        map[cacheKey]*entry
	lru      list.List // front: most recently used
	users    int       // live transports
	sweeping bool
	stop     chan struct{}
}

func newHandleCache(limit int) *handleCache {
	return &handleCache{
		open: cuda.IPCOpenMemHandle, close: cuda.IPCCloseMemHandle, alive: transport.ProcessAlive,
		now: time.Now, warn: func(string, ...any) {},
		limit: limit, m: map[cacheKey]*entry{},
	}
}

// acquire returns the open mapping for key, opening it in key.dev's
// context on a miss; the caller must release it.
func (c *handleCache) acquire(key cacheKey, pid int) (*entry, error) {
	return c.acquireWith(key, pid, func() (cuda.Ptr, func() error, error) {
		p, err := c.open(key.dev, key.handle)
		return p, nil, err
	})
}

// acquireWith is acquire with the opening given: open returns the
// mapping's base and how to close it (nil: the cache's close).
func (c *handleCache) acquireWith(key cacheKey, pid int, open func() (cuda.Ptr, func() error, error)) (*entry, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.m[key]; ok {
		e.refs++
		e.lastUse = c.now()
		c.lru.MoveToFront(e.elem)
		return e, nil
	}
	p, unmap, err := open()
	if err != nil {
		return nil, err
	}
	e := &entry{key: key, ptr: p, unmap: unmap, pid: pid, refs: 1, lastUse: c.now()}
	e.elem = c.lru.PushFront(e)
	c.m[key] = e
	c.evictLocked()
	c.startSweepLocked()
	return e, nil
}

// release drops a request's use of e.
func (c *handleCache) release(e *entry) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e.refs--
	e.lastUse = c.now()
	if e.dead && e.refs == 0 {
		c.closeEntry(e)
	}
	c.evictLocked()
}

func (c *handleCache) removeLocked(e *entry) {
	if e.dead {
		return
	}
	e.dead = true
	delete(c.m, e.key)
	c.lru.Remove(e.elem)
	if e.refs == 0 {
		c.closeEntry(e)
	}
}

func (c *handleCache) closeEntry(e *entry) {
	if e.unmap != nil {
		if err := e.unmap(); err != nil {
			c.warn("closing a mapping of shared chunks: %v", err)
		}
		return
	}
	if err := c.close(e.key.dev, e.ptr); err != nil {
		c.warn("closing an IPC mapping: %v", err)
	}
}

// evictLocked closes idle entries from the least recently used end while
// the cache is over its limit.
func (c *handleCache) evictLocked() {
	for el := c.lru.Back(); el != nil && len(c.m) > c.limit; {
		prev := el.Prev()
		if e := el.Value.(*entry); e.refs == 0 {
			c.removeLocked(e)
		}
		el = prev
	}
}

// dropSource closes the entries of a source runtime that is gone (those in
// use, once released). Another runtime of this process that still reads
// from it opens them again.
func (c *handleCache) dropSource(source transport.RuntimeID) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for el := c.lru.Front(); el != nil; {
		next := el.Next()
		if e := el.Value.(*entry); e.key.source == source {
			c.removeLocked(e)
		}
		el = next
	}
}

// sweep closes entries idle too long and those of exited sources.
func (c *handleCache) sweep() {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.now()
	gone := map[int]bool{}
	for el := c.lru.Back(); el != nil; {
		prev := el.Prev()
		e := el.Value.(*entry)
		dead, checked := gone[e.pid]
		if !checked {
			// Kept beside PeerGone: a source whose forked child holds its control
			// socket is reported only after the peer timeout, its mapping meanwhile.
			dead = !c.alive(e.pid)
			gone[e.pid] = dead
		}
		if dead || (e.refs == 0 && now.Sub(e.lastUse) >= idleTimeout) {
			c.removeLocked(e)
		}
		el = prev
	}
}

func (c *handleCache) startSweepLocked() {
	if c.sweeping {
		return
	}
	c.sweeping = true
	stop := make(chan struct{})
	c.stop = stop
	go func() {
		tick := time.NewTicker(sweepEvery)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			c.sweep()
			c.mu.Lock()
			if len(c.m) == 0 {
				c.sweeping = false
				c.stop = nil
				c.mu.Unlock()
				return
			}
			c.mu.Unlock()
		}
	}()
}

// addUser and dropUser count the transports sharing the cache; when the last
// goes, every entry is closed (those in use, once released).
func (c *handleCache) addUser() {
	c.mu.Lock()
	c.users++
	c.mu.Unlock()
}

func (c *handleCache) dropUser() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.users--
	if c.users > 0 {
		return
	}
	for el := c.lru.Front(); el != nil; {
		next := el.Next()
		c.removeLocked(el.Value.(*entry))
		el = next
	}
	if c.stop != nil {
		close(c.stop)
		c.stop = nil
		c.sweeping = false
	}
}

// len is the number of cached mappings.
func (c *handleCache) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.m)
}
