package nixl

/*
#include <stdlib.h>
#include "shim.h"
*/
import "C"

import (
	"sync"
	"unsafe"

	"github.com/rdt-project/rdt/core/transport"
)

// RegCacheEnv names the environment variable that turns the receive
// registration cache off ("0"): for applications that unmap memory with raw
// system calls, which UCX's hooks do not see.
const RegCacheEnv = "RDT_NIXL_REGISTRATION_CACHE"

const (
	// maxCachedRegions and maxCachedBytes bound the receive registrations
	// kept between fetches (over RDMA every byte of them is pinned).
	maxCachedRegions = 4096
	maxCachedBytes   = 4 << 30
)

// The slots of the C table that UCX's hook clears, shared by every
// transport of the process (the hook is process-wide).
var (
	hooksOnce sync.Once
	hooksErr  string // why the cache is off, once hooksOnce ran
	slotMu    sync.Mutex
	freeSlots []int
)

// initHooks installs the invalidation hook once per process, after the
// first agent loaded UCX.
func initHooks() string {
	hooksOnce.Do(func() {
		if v, _ := cgetenv(RegCacheEnv); v == "0" {
			hooksErr = RegCacheEnv + "=0"
			return
		}
		var what *C.char
		if C.rdtnx_hooks_init(&what) != 0 {
			hooksErr = C.GoString(what)
			return
		}
		for i := C.RDTNX_CACHE_SLOTS - 1; i >= 0; i-- {
			freeSlots = append(freeSlots, i)
		}
	})
	return hooksErr
}

func takeSlot() (int, bool) {
	slotMu.Lock()
	defer slotMu.Unlock()
	if len(freeSlots) == 0 {
		return 0, false
	}
	s := freeSlots[len(freeSlots)-1]
	freeSlots = freeSlots[:len(freeSlots)-1]
	return s, true
}

func putSlot(s int) {
	C.rdtnx_slot_clear(C.int(s))
	slotMu.Lock()
	freeSlots = append(freeSlots, s)
	slotMu.Unlock()
}

// cached is one receive region registered with the agent and kept between
// fetches while the memory stays mapped.
type cached struct {
	key     regKey
	dlist   unsafe.Pointer
	slot    int
	refs    int    // fetches using it now
	lastUse uint64 // for least-recently-used eviction
}

// regCache keeps receive registrations of host memory. An entry is used
// again only while its slot is live: UCX's memory hook clears the slot
// when the memory is unmapped (or its pages dropped), so a buffer freed
// and another allocated at the same address is registered afresh.
type regCache struct {
	mu         sync.Mutex
	entries    map[regKey]*cached
	bytes      uint64
	tick       uint64
	registered uint64 // registrations made for the cache so far
	off        string // why the cache is off; "" while it works

	maxRegions int    // maxCachedRegions but in tests
	maxBytes   uint64 // maxCachedBytes but in tests
}

// lease is what a fetch holds of the receive registrations: cached entries
// (released to the cache) and registrations of its own (deregistered).
type lease struct {
	entries []*cached
	own     []unsafe.Pointer
}

// registerTargets registers the host targets (through the cache where it
// works) and the device targets for this fetch alone.
func (t *Transport) registerTargets(agent unsafe.Pointer, local []regKey) (*lease, error) {
	l := &lease{}
	var uncached []regKey
	if off := t.cacheOff(); off == "" {
		for _, k := range local {
			if k.mem != memDRAM {
				uncached = append(uncached, k)
				continue
			}
			e, err := t.cacheGet(agent, k)
			if err != nil {
				t.releaseLease(agent, l)
				return nil, err
			}
			if e == nil {
				uncached = append(uncached, k)
				continue
			}
			l.entries = append(l.entries, e)
		}
	} else {
		uncached = local
	}
	for _, mem := range []uint8{memDRAM, memVRAM} {
		these := ofMemory(uncached, mem)
		if len(these) == 0 {
			continue
		}
		d, err := registerList(agent, these)
		if err != nil {
			t.releaseLease(agent, l)
			return nil, err
		}
		l.own = append(l.own, d)
	}
	return l, nil
}

func registerList(agent unsafe.Pointer, keys []regKey) (unsafe.Pointer, error) {
	d, err := dlist(keys)
	if err != nil {
		return nil, err
	}
	var call *C.char
	if st := C.rdtnx_register(agent, d, &call); st != C.RDTNX_SUCCESS {
		C.rdtnx_dlist_free(d)
		return nil, callError(transport.ErrTransport, "registering the targets", call, st)
	}
	return d, nil
}

func (t *Transport) deregisterList(agent unsafe.Pointer, d unsafe.Pointer) {
	var call *C.char
	if st := C.rdtnx_deregister(agent, d, &call); st != C.RDTNX_SUCCESS {
		t.h.Log().Warnf("%v", callError(transport.ErrTransport, "deregistering the targets", call, st))
	}
	C.rdtnx_dlist_free(d)
}

func (t *Transport) cacheOff() string {
	if off := initHooks(); off != "" {
		t.cache.mu.Lock()
		if t.cache.off == "" {
			t.cache.off = off
			t.h.Log().Debugf("receive registrations are not cached: %s", off)
		}
		t.cache.mu.Unlock()
		return off
	}
	return ""
}

// cacheGet returns the live entry of k, registering it when it is missing
// or its memory was unmapped since. It returns nil (and no error) when k
// cannot be cached now: larger than the cache, or every entry in use.
func (t *Transport) cacheGet(agent unsafe.Pointer, k regKey) (*cached, error) {
	c := &t.cache
	c.mu.Lock()
	defer c.mu.Unlock()
	c.tick++
	if e, ok := c.entries[k]; ok {
		if C.rdtnx_slot_live(C.int(e.slot)) != 0 {
			e.refs++
			e.lastUse = c.tick
			return e, nil
		}
		if e.refs > 0 {
			// Unmapped while another fetch writes into it: that fetch
			// keeps it; this one registers on its own.
			return nil, nil
		}
		t.dropLocked(agent, e)
	}
	if k.size > c.maxBytes {
		return nil, nil
	}
	for len(c.entries) >= c.maxRegions || c.bytes+k.size > c.maxBytes {
		if !t.evictLocked1(agent) {
			return nil, nil
		}
	}
	slot, ok := takeSlot()
	if !ok {
		return nil, nil // other transports of the process hold every slot
	}
	d, err := registerList(agent, []regKey{k})
	if err != nil {
		putSlot(slot)
		return nil, err
	}
	// The slot goes live after the registration: an unmap from here on
	// clears it.
	C.rdtnx_slot_set(C.int(slot), C.uint64_t(k.addr), C.uint64_t(k.size))
	e := &cached{key: k, dlist: d, slot: slot, refs: 1, lastUse: c.tick}
	if c.entries == nil {
		c.entries = map[regKey]*cached{}
	}
	c.entries[k] = e
	c.bytes += k.size
	c.registered++
	return e, nil
}

// evictLocked1 drops the least recently used idle entry.
func (t *Transport) evictLocked1(agent unsafe.Pointer) bool {
	var old *cached
	for _, e := range t.cache.entries {
		if e.refs == 0 && (old == nil || e.lastUse < old.lastUse) {
			old = e
		}
	}
	if old == nil {
		return false
	}
	t.dropLocked(agent, old)
	return true
}

func (t *Transport) dropLocked(agent unsafe.Pointer, e *cached) {
	delete(t.cache.entries, e.key)
	t.cache.bytes -= e.key.size
	putSlot(e.slot)
	t.deregisterList(agent, e.dlist)
}

// releaseLease hands the cached entries back and deregisters the rest.
func (t *Transport) releaseLease(agent unsafe.Pointer, l *lease) {
	if l == nil {
		return
	}
	if len(l.entries) > 0 {
		t.cache.mu.Lock()
		for _, e := range l.entries {
			e.refs--
		}
		t.cache.mu.Unlock()
	}
	for _, d := range l.own {
		t.deregisterList(agent, d)
	}
	l.entries, l.own = nil, nil
}

// dropCache deregisters every cached entry (at Close, when no fetch is left).
func (t *Transport) dropCache(agent unsafe.Pointer) {
	t.cache.mu.Lock()
	defer t.cache.mu.Unlock()
	for _, e := range t.cache.entries {
		t.dropLocked(agent, e)
	}
}

// cacheState is what the cache holds (tests): entries, bytes, the
// registrations it made so far, and whether the entry of key is live.
func (t *Transport) cacheState(key regKey) (entries int, bytes, registered uint64, live bool) {
	t.cache.mu.Lock()
	defer t.cache.mu.Unlock()
	if e, ok := t.cache.entries[key]; ok {
		live = C.rdtnx_slot_live(C.int(e.slot)) != 0
	}
	return len(t.cache.entries), t.cache.bytes, t.cache.registered, live
}

// freeSlotCount is how many invalidation slots no transport holds (tests).
func freeSlotCount() int {
	slotMu.Lock()
	defer slotMu.Unlock()
	return len(freeSlots)
}

// libcBuffer maps n bytes with libc's mmap (at the address at, unless
// zero, without replacing a mapping there); free unmaps them with libc's
// munmap, which UCX's hooks see (tests).
func libcBuffer(n int, at uintptr) (p unsafe.Pointer, free func() error) {
	m := C.rdtnx_libc_map(C.size_t(n), C.uint64_t(at))
	if m == nil {
		return nil, nil
	}
	return m, func() error {
		if C.rdtnx_libc_unmap(m, C.size_t(n)) != 0 {
			return transport.Errorf(transport.ErrTransport, "munmap failed")
		}
		return nil
	}
}
