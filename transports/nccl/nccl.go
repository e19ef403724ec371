// Package nccl is the nccl transport: two-sided transfers of CUDA device
// memory between the ranks of a group, with NCCL's point-to-point send and
// receive. Groups are formed over rdt's control plane (core/engine/group.go): rank
// 0 makes the ncclUniqueIds, every rank gets them in the roster and calls
// ncclCommInitRank on its device. A group is two communicators, each with
// its own stream: one carries the transfers from lower to higher ranks, the
// other those from higher to lower ranks (see lane). For a transfer, the
// destination's communicator metadata names the group, both ranks and a
// sequence number; the source runtime's send enqueues ncclSend of each
// tensor (of each piece, in a partial fetch), the destination's fetch
// enqueues ncclRecv into the targets, each
// inside one ncclGroupStart/End on the stream of the transfer's
// communicator, and completion is polled with a CUDA event and
// ncclCommGetAsyncError.
//
// A transfer that fails or is aborted destroys its group (ncclCommAbort) on
// that rank: NCCL cannot take back an operation once enqueued, and the two
// sides would no longer agree on the order of the next ones. Later
// transfers over the group fail with "group X was destroyed after ...".
//
// libnccl.so.2 and libcuda are loaded at run time: without them the factory
// reports ErrUnsupported and runtimes simply do not list the transport.
package nccl

import (
	"sync"
	"time"

	"github.com/rdt-project/rdt/core/transport"
	"github.com/rdt-project/rdt/transports/internal/cuda"
)

// Name is the canonical transport name.
const Name = "nccl"

// Factory makes the transport for a new runtime.
func Factory() transport.TransportFactory {
	return transport.TransportFactory{Name: Name, New: New, Settings: Settings()}
}

// Available reports why the transport cannot work here ("" if it can).
func Available() error {
	if err := Load(); err != nil {
		return err
	}
	n, err := cuda.DeviceCount()
	if err != nil {
		return transport.Wrap(err, "NCCL %s is installed, but CUDA is not usable", VersionString())
	}
	if n == 0 {
		return transport.Errorf(transport.ErrUnsupported, "NCCL %s is installed, but the CUDA driver sees no device", VersionString())
	}
	return nil
}

// Transport is the nccl transport of one runtime.
type Transport struct {
	h transport.Host

	mu      sync.Mutex
	groups  map[string]*group
	ops     map[uint64]*op      // in-flight transfers by transfer id
	aborted map[uint64]struct{} // aborts that came before their transfer
	closed  bool

	teardown time.Duration // RDT_NCCL_TEARDOWN_MS
}

// New makes the transport: ErrUnsupported without NCCL, CUDA or a device.
func New(h transport.Host) (transport.Transport, error) {
	if err := Available(); err != nil {
		return nil, transport.Wrap(err, "it needs the NCCL library (libnccl.so.2, or RDT_NCCL_LIBRARY) and a CUDA driver with a device")
	}
	return &Transport{h: h, groups: map[string]*group{}, ops: map[uint64]*op{}, aborted: map[uint64]struct{}{},
		teardown: time.Duration(teardownSetting.In(h.Settings())) * time.Millisecond}, nil
}

// Describe: nccl is two-sided (the source's Send runs ncclSend), reaches
// any host, is the last automatic choice for CUDA data, and forms the
// groups that name no backend. A send or receive is any device range, so
// partial fetches move only their pieces.
func (t *Transport) Describe() transport.Descriptor {
	return transport.Descriptor{
		Name:         Name,
		Devices:      []transport.DeviceType{transport.DeviceCUDA},
		CanAbort:     true,
		Ranges:       true,
		Auto:         transport.AutoRank{CUDA: 30},
		GroupBackend: true,
	}
}

// Close destroys every group's communicator, all at once, and waits at
// most RDT_NCCL_TEARDOWN_MS in all for NCCL to free them. NCCL frees a
// communicator once the ranks of it on the same host have destroyed
// theirs too; each group's lanes tear down on their own goroutines, so
// two runtimes on one host that share groups never wait for each other
// whatever order they destroy them in, and a rank whose peers never come
// leaves the teardown to finish in the background.
func (t *Transport) Close() error {
	t.mu.Lock()
	t.closed = true
	gs := t.groups
	t.groups = map[string]*group{}
	t.mu.Unlock()
	var wg sync.WaitGroup
	for _, g := range gs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			g.destroy(transport.Errorf(transport.ErrClosed, "the runtime was destroyed"), false)
		}()
	}
	wg.Wait()
	timer := time.NewTimer(t.teardown)
	defer timer.Stop()
	for _, g := range gs {
		select {
		case <-g.torn:
		case <-timer.C:
			t.h.Log().Warnf("NCCL has not freed the communicators of %d group(s) after %v; it frees them in the background once their other ranks on this host destroy theirs (or exit)", countLeft(gs), t.teardown)
			return nil
		}
	}
	return nil
}

// countLeft counts the groups whose communicators NCCL has not freed yet.
func countLeft(gs map[string]*group) int {
	n := 0
	for _, g := range gs {
		select {
		case <-g.torn:
		default:
			n++
		}
	}
	return n
}

var _ transport.GroupBackend = (*Transport)(nil)
