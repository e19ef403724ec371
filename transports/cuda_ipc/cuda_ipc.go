// Package cudaipc is the cuda_ipc transport: one-sided transfers of CUDA
// device memory between processes on one host with CUDA IPC. The source
// exports an IPC handle of each allocation holding its tensors (the base of
// the allocation, plus each tensor's offset in it); the receiver opens the
// handle (cached, see cache.go) on the device of the target that reads it,
// which need not be the source's GPU nor see it, and copies into its
// targets on a CUDA stream of that device. The source application does
// nothing per transfer. libcuda is loaded at run time: without it the
// factory reports ErrUnsupported and runtimes simply do not list the
// transport.
package cudaipc

import (
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"os"
	"sync"
	"sync/atomic"

	"github.com/rdt-project/rdt/core/transport"
	"github.com/rdt-project/rdt/transports/internal/cuda"
)

// Name is the canonical transport name.
const Name = "cuda_ipc"

// streamsPerDevice is how many streams concurrent fetches spread over.
const streamsPerDevice = 4

// Factory makes the transport for a new runtime.
func Factory() transport.TransportFactory {
	return transport.TransportFactory{Name: Name, New: New, Settings: Settings()}
}

var (
	procToken = func() uint64 {
		var b [8]byte
		if _, err := rand.Read(b[:]); err != nil {
			panic(err)
		}
		return binary.LittleEndian.Uint64(b[:]) | 1
	}()

	cacheOnce sync.Once
	cache     *handleCache
)

// sharedCache is the process's cache, sized by the first runtime's
// RDT_CUDA_IPC_CACHE.
func sharedCache(h transport.Host) *handleCache {
	cacheOnce.Do(func() {
		cache = newHandleCache(cacheSetting.In(h.Settings()))
		cache.warn = h.Log().Warnf
	})
	return cache
}

// Transport is the cuda_ipc transport of one runtime.
type Transport struct {
	h     transport.Host
	pid   int
	cache *handleCache

	mu      sync.Mutex
	streams map[int]*streamSet
	events  map[int][]*cuda.Event // free events per device
	closed  bool
}

type streamSet struct {
	s    []*cuda.Stream
	next atomic.Uint32
}

// New makes the transport: ErrUnsupported without a CUDA driver or device.
func New(h transport.Host) (transport.Transport, error) {
	n, err := cuda.DeviceCount()
	if err != nil {
		return nil, err
	}
	if n == 0 {
		return nil, transport.Errorf(transport.ErrUnsupported, "the CUDA driver sees no device")
	}
	t := &Transport{h: h, pid: os.Getpid(), cache: sharedCache(h),
		streams: map[int]*streamSet{}, events: map[int][]*cuda.Event{}}
	t.cache.addUser()
	return t, nil
}

// Describe: CUDA IPC handles only open on the machine that made them, so
// cuda_ipc works on the same host only, where it is the first choice for
// CUDA data. A copy starts anywhere in an opened allocation, so partial
// fetches copy only their pieces, and lands in host memory as well as on a
// device.
func (t *Transport) Describe() transport.Descriptor {
	return transport.Descriptor{
		Name:         Name,
		Devices:      []transport.DeviceType{transport.DeviceCUDA},
		OneSided:     true,
		CanAbort:     true,
		SameHostOnly: true,
		Ranges:       true,
		Writes:       true,
		CrossDevice: []transport.DevicePair{
			{Source: transport.DeviceCUDA, Target: transport.DeviceCPU},
			{Source: transport.DeviceCUDA, Target: transport.DeviceCUDAHost},
		},
		Auto: transport.AutoRank{CUDA: 10},
	}
}

// checkDevice refuses a CUDA tensor whose device ordinal this process has
// no device for. The driver would only say CUDA_ERROR_INVALID_DEVICE from
// whichever call met the ordinal first, which core reads as "unsupported"
// and would try another transport.
func (t *Transport) checkDevice(what string, i int, d transport.Device) error {
	n, err := cuda.DeviceCount()
	if err != nil {
		return err
	}
	if d.ID < 0 || int(d.ID) >= n {
		vis := ""
		if mask, set := t.h.Settings().Lookup(visibleDevicesSetting.Name); set {
			vis = fmt.Sprintf(" (CUDA_VISIBLE_DEVICES=%q)", mask)
		}
		return transport.Errorf(transport.ErrInvalidArgument, "%s %d is on %s, but this process sees %d CUDA device(s)%s", what, i, d, n, vis)
	}
	return nil
}

// Close frees the streams and events; the last transport of the process
// also closes the cached mappings.
func (t *Transport) Close() error {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return nil
	}
	t.closed = true
	streams, events := t.streams, t.events
	t.streams, t.events = map[int]*streamSet{}, map[int][]*cuda.Event{}
	t.mu.Unlock()
	var first error
	for _, ss := range streams {
		for _, s := range ss.s {
			if err := s.Synchronize(); err != nil && first == nil {
				first = err
			}
			if err := s.Destroy(); err != nil && first == nil {
				first = err
			}
		}
	}
	for _, evs := range events {
		for _, e := range evs {
			if err := e.Destroy(); err != nil && first == nil {
				first = err
			}
		}
	}
	t.cache.dropUser()
	return first
}

// PeerGone closes the mappings opened from a runtime that is gone, without
// waiting for the sweep to notice its process exited.
func (t *Transport) PeerGone(peer transport.PeerInfo) {
	t.cache.dropSource(peer.RuntimeID)
}

// checkOpen refuses work on a closed transport before it opens anything:
// a mapping opened after the last transport of the process closed would
// stay open until the cache's idle timeout.
func (t *Transport) checkOpen() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return transport.Errorf(transport.ErrClosed, "the transport is closed")
	}
	return nil
}
