package nixl

/*
#include <stdlib.h>
#include "shim.h"
*/
import "C"

import (
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/rdt-project/rdt/core/transport"
)

// The source agents whose metadata this agent loaded, kept for the next
// transfer from them: a cache bounded by maxRemotes (least recently used
// out first), whose entries transfers hold shared and reloads and
// evictions exclusively.

// maxRemotes bounds the source agents whose metadata a receiver keeps
// loaded: a bound on memory for many live sources (gone ones are dropped at
// PeerGone), so the least recently used agent is invalidated when a new one
// would exceed it.
const maxRemotes = 64

// remote is a source agent whose metadata this agent loaded.
type remote struct {
	name string
	// mu is held shared by every transfer from the agent and exclusively
	// to (re)load or invalidate it: invalidating an agent makes its
	// in-flight requests fail.
	mu      sync.RWMutex
	valid   bool
	epoch   uint64
	evicted bool
	stale   atomic.Bool // a transfer failed: reload before the next one
	lastUse uint64      // under Transport.remMu
}

// remoteEntry finds or adds the cache entry of a source agent, evicting the
// least recently used idle one beyond maxRemotes.
func (t *Transport) remoteEntry(agent unsafe.Pointer, name string) *remote {
	t.remMu.Lock()
	defer t.remMu.Unlock()
	t.useTick++
	if r, ok := t.remotes[name]; ok {
		r.lastUse = t.useTick
		return r
	}
	r := &remote{name: name, lastUse: t.useTick}
	t.remotes[name] = r
	for len(t.remotes) > maxRemotes {
		var old *remote
		for _, c := range t.remotes {
			if c != r && (old == nil || c.lastUse < old.lastUse) {
				old = c
			}
		}
		if old == nil || !t.evictLocked(agent, old) {
			break // in use: try again on the next new agent
		}
	}
	return r
}

// evictLocked forgets the cache entry r and the metadata loaded for it,
// unless a transfer is using it (then it returns false). The caller holds
// remMu.
func (t *Transport) evictLocked(agent unsafe.Pointer, r *remote) bool {
	if !r.mu.TryLock() {
		return false
	}
	if r.valid {
		t.invalidate(agent, r.name)
	}
	r.valid, r.evicted = false, true
	delete(t.remotes, r.name)
	r.mu.Unlock()
	return true
}

func (t *Transport) invalidate(agent unsafe.Pointer, name string) {
	cname := C.CString(name)
	defer C.free(unsafe.Pointer(cname))
	var call *C.char
	// NOT_FOUND: NIXL already forgot it (it does so when a peer disconnects).
	if st := C.rdtnx_invalidate(agent, cname, &call); st != C.RDTNX_SUCCESS && st != -6 {
		t.h.Log().Debugf("%v", callError(transport.ErrTransport, "forgetting agent "+name, call, st))
	}
}

func loadMD(agent unsafe.Pointer, blob []byte, want string) error {
	p := C.CBytes(blob)
	defer C.free(p)
	var name *C.char
	var call *C.char
	st := C.rdtnx_load_md(agent, p, C.size_t(len(blob)), &name, &call)
	if st != C.RDTNX_SUCCESS {
		return callError(transport.ErrTransport, "loading the source agent's metadata", call, st)
	}
	got := C.GoString(name)
	C.rdtnx_free(unsafe.Pointer(name))
	if got != want {
		return transport.Errorf(transport.ErrCorrupt, "the metadata names agent %q, expected %q", got, want)
	}
	return nil
}

// acquire makes the source agent's memory of m addressable and returns its
// entry held shared (release with mu.RUnlock once the transfer is over).
// With try set it never waits: ok is false when the entry is held
// exclusively, or must be reloaded while transfers hold it shared. Fetch
// tries; the request's poster waits (see Fetch).
func (t *Transport) acquire(agent unsafe.Pointer, m *metadata, try bool) (r *remote, ok bool, err error) {
	var lastErr error
	for attempt := 0; attempt < 3; attempt++ {
		r := t.remoteEntry(agent, m.Agent)
		if try {
			if !r.mu.TryRLock() {
				return nil, false, nil
			}
		} else {
			r.mu.RLock()
		}
		if r.valid && !r.stale.Load() && r.epoch >= m.Epoch {
			var err error
			for _, b := range m.Blobs {
				if err = loadMD(agent, b, m.Agent); err != nil {
					break
				}
			}
			if err == nil {
				return r, true, nil
			}
			// Refused descriptors mean our view of the agent is out of date.
			lastErr = err
			r.stale.Store(true)
			r.mu.RUnlock()
			continue
		}
		r.mu.RUnlock()
		if try {
			if !r.mu.TryLock() {
				return nil, false, nil
			}
		} else {
			r.mu.Lock()
		}
		if r.evicted {
			r.mu.Unlock()
			continue
		}
		if !(r.valid && !r.stale.Load() && r.epoch >= m.Epoch) {
			if r.valid {
				t.invalidate(agent, r.name)
				r.valid = false
			}
			if err := loadMD(agent, m.Conn, m.Agent); err != nil {
				r.mu.Unlock()
				return nil, false, err
			}
			r.valid, r.epoch = true, m.Epoch
			r.stale.Store(false)
		}
		r.mu.Unlock()
	}
	if lastErr == nil {
		lastErr = transport.Errorf(transport.ErrTransport, "the source agent's metadata kept changing")
	}
	return nil, false, lastErr
}
