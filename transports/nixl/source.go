package nixl

/*
#include <stdlib.h>
#include "shim.h"
*/
import "C"

import (
	"unsafe"

	"github.com/rdt-project/rdt/core/transport"
)

// ExtractMetadata registers the tensors' memory with the agent (once per
// region, shared between objects that put the same region) and describes
// it for receivers.
func (t *Transport) ExtractMetadata(obj transport.ObjectID, tensors []transport.Tensor) ([]byte, error) {
	agent, err := t.ensureAgent()
	if err != nil {
		return nil, err
	}
	m := metadata{Agent: t.name, Conn: t.conn}
	var keys []regKey
	for _, x := range tensors {
		mem, dev, err := memOf(x.Device)
		if err != nil {
			return nil, err
		}
		m.Regions = append(m.Regions, region{Addr: uint64(x.Data), Size: x.Nbytes, Dev: dev, Mem: mem})
		if x.Nbytes > 0 {
			keys = append(keys, regKey{mem: mem, addr: uint64(x.Data), size: x.Nbytes, dev: dev})
		}
	}
	// Touching tensors are registered as one region (metadata version 2
	// promises it), so that a receiver reads a run of them with one
	// descriptor.
	keys = coalesce(keys)
	if err := t.register(agent, obj, keys); err != nil {
		return nil, err
	}
	m.Epoch = t.epoch.Load()
	for _, mem := range []uint8{memDRAM, memVRAM} {
		these := ofMemory(keys, mem)
		if len(these) == 0 {
			continue
		}
		blob, err := partialMD(agent, these)
		if err != nil {
			t.GarbageCollect(obj, tensors, nil)
			return nil, err
		}
		m.Blobs = append(m.Blobs, blob)
	}
	return m.encode(), nil
}

func partialMD(agent unsafe.Pointer, keys []regKey) ([]byte, error) {
	d, err := dlist(keys)
	if err != nil {
		return nil, err
	}
	defer C.rdtnx_dlist_free(d)
	var data unsafe.Pointer
	var n C.size_t
	var call *C.char
	if st := C.rdtnx_partial_md(agent, d, &data, &n, &call); st != C.RDTNX_SUCCESS {
		return nil, callError(transport.ErrTransport, "metadata of registered memory", call, st)
	}
	defer C.rdtnx_free(data)
	if n == 0 || n > maxBlob {
		return nil, transport.Errorf(transport.ErrTransport, "the agent's metadata is %d bytes (want 1 to %d)", int(n), maxBlob)
	}
	return C.GoBytes(data, C.int(n)), nil
}

// register registers the regions not yet registered and counts the
// object's use of each.
func (t *Transport) register(agent unsafe.Pointer, obj transport.ObjectID, keys []regKey) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	done := 0
	for _, k := range keys {
		if r, ok := t.regs[k]; ok {
			r.refs++
			done++
			continue
		}
		d, err := dlist([]regKey{k})
		if err == nil {
			var call *C.char
			if st := C.rdtnx_register(agent, d, &call); st != C.RDTNX_SUCCESS {
				C.rdtnx_dlist_free(d)
				err = callError(transport.ErrTransport, "registering memory", call, st)
			}
		}
		if err != nil {
			t.unregisterLocked(agent, keys[:done])
			return err
		}
		t.regs[k] = &registration{dlist: d, refs: 1}
		done++
	}
	t.objs[obj] = append(t.objs[obj], keys...)
	return nil
}

func (t *Transport) unregisterLocked(agent unsafe.Pointer, keys []regKey) {
	for _, k := range keys {
		r, ok := t.regs[k]
		if !ok {
			continue
		}
		if r.refs--; r.refs > 0 {
			continue
		}
		delete(t.regs, k)
		var call *C.char
		if st := C.rdtnx_deregister(agent, r.dlist, &call); st != C.RDTNX_SUCCESS {
			t.h.Log().Warnf("%v", callError(transport.ErrTransport, "deregistering memory", call, st))
		}
		C.rdtnx_dlist_free(r.dlist)
	}
}

// GarbageCollect deregisters the object's memory (regions other live
// objects also put stay registered).
func (t *Transport) GarbageCollect(obj transport.ObjectID, tensors []transport.Tensor, tmeta []byte) {
	t.agentMu.Lock()
	agent := t.agent
	t.agentMu.Unlock()
	if agent == nil {
		return
	}
	t.epoch.Add(1) // before the memory goes: see Transport.epoch
	t.mu.Lock()
	defer t.mu.Unlock()
	keys := t.objs[obj]
	delete(t.objs, obj)
	t.unregisterLocked(agent, keys)
}
