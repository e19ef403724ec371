// Package shm moves host memory between processes on one host through
// shared memory: the source stages an object once, into its arena (one
// long-lived memfd for objects of up to 4 MiB, which a receiver maps once
// and then reads without asking; see arena.go) or into a sealed memfd of
// its own, whose descriptor a receiver gets over a Unix socket
// (SCM_RIGHTS) and reads into its targets. Memfds have no name in any file
// system, so nothing is ever left in /dev/shm, even after a crash.
package shm

import (
	"time"

	"github.com/rdt-project/rdt/core/transport"
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

// Transport is the shm transport of one runtime, in the roles it plays:
// the owner of objects (srv: staging them and the segment server, which
// lands writes), and a peer of other owners (peers: what it keeps for their
// segment servers), through which it fetches and views (rcv) and writes
// (wr).
type Transport struct {
	srv   *server
	peers *peers
	rcv   *receiver
	wr    *writer
}

// New makes the transport; its socket appears with the first staged object.
func New(h transport.Host) (transport.Transport, error) {
	p := newPeers()
	return &Transport{srv: newServer(h), peers: p, rcv: &receiver{h: h, peers: p}, wr: &writer{peers: p}}, nil
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

// Close stops serving, frees every segment and lets go of what is kept for
// other runtimes.
func (t *Transport) Close() error {
	t.srv.close()
	t.peers.close()
	return nil
}

// PeerGone closes the connections kept to a source runtime that is gone:
// a receiver fed by many short-lived sources keeps no socket per source.
func (t *Transport) PeerGone(peer transport.PeerInfo) { t.peers.drop(peer.RuntimeID) }
