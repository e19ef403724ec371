package transporttest

import (
	"bytes"
	"math/rand"
	"os"
	"testing"
	"time"

	"github.com/rdt-project/rdt/core/transport"
)

// The cases of transfers that must end rather than read what they should
// not: aborted, past a deadline, of a freed object, of metadata another
// host made, from a source killed before or during the fetch.

func (s *suite) large() int {
	if s.conf.LargeBytes > 0 {
		return s.conf.LargeBytes
	}
	return 256 << 20
}

func (s *suite) largeTensor(t *testing.T, e *end) transport.Tensor {
	addr, free, err := e.mem.Alloc(s.large())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(free)
	return Describe(e.mem.Device, Uint8, addr, s.large())
}

func (s *suite) abort(t *testing.T) {
	src, dst := s.newEnd(t, 1), s.newEnd(t, 0)
	if !dst.desc.CanAbort {
		t.Skip("the descriptor says the transport cannot abort (the engine never calls Abort)")
	}
	if s.grouped() {
		s.groupPair(t, src, dst)
	}
	obj := transport.ObjectID{6}
	source := s.largeTensor(t, src)
	src.host.Hold(obj, []transport.Tensor{source})
	meta, err := src.tr.ExtractMetadata(obj, []transport.Tensor{source})
	if err != nil {
		t.Fatal(err)
	}
	x := transfer(obj, dst.desc.Name, src.host.Identity(), dst.host.Identity())
	req, err := start(dst, x, []transport.Tensor{s.largeTensor(t, dst)}, meta)
	if err != nil {
		t.Fatal(err)
	}
	dst.tr.Abort(x, req)
	wantStatus(t, finish(t, req, 30*time.Second), "an aborted fetch", transport.ErrAborted)
}

// A source that is alive but answers nothing (stopped) holds no fetch
// past its deadline: the fetch finishes (a one-sided read needs nothing of
// the source's threads) or fails saying the source is gone; once the
// deadline passes, the engine's Abort ends it at once on a transport that
// can abort, and any other gives up within the host's peer timeout.
func (s *suite) deadline(t *testing.T) {
	const timeout = time.Second
	dst := s.newEnd(t, 0, func(h *Host) { h.Timeout = timeout })
	src := s.source(t, dst, 4096)
	src.Stop()
	defer src.Continue()
	target := s.tensor(t, dst, Uint8, 4096, 0)
	x := transfer(SourceObject, dst.desc.Name, src.Peer, dst.host.Identity())
	req, err := start(dst, x, []transport.Tensor{target}, src.Meta)
	if err == nil {
		done := make(chan error, 1)
		go func() { done <- req.Wait() }()
		select {
		case err = <-done:
		case <-time.After(timeout):
			within := timeout + Margin
			if dst.desc.CanAbort {
				dst.tr.Abort(x, req)
				within = Margin
			}
			select {
			case err = <-done:
			case <-time.After(within):
				t.Fatalf("the fetch did not end within %v of its deadline", within)
			}
		}
		// Release may wait for I/O the transport cannot cancel (nixl's):
		// the source resumes first.
		src.Continue()
		release(t, req)
	}
	if err == nil {
		if !bytes.Equal(s.read(t, dst, target), src.Want[0]) {
			t.Fatal("the fetch succeeded with the wrong bytes")
		}
		return
	}
	wantStatus(t, err, "a stopped source", transport.ErrAborted, transport.ErrPeerUnavailable, transport.ErrTimeout)
}

func (s *suite) freedObject(t *testing.T) {
	src, dst, meta, tensors, x := s.pair(t, transport.ObjectID{7}, []transport.DType{Uint8}, []int{8192})
	if !dst.desc.DetectsFreedObjects {
		t.Skip("the descriptor says the transport cannot detect a freed object (the engine waits for the owner's answer instead)")
	}
	if err := fetch(t, dst, x, s.targets(t, dst, tensors), meta); err != nil {
		t.Fatal(err)
	}
	src.host.Drop(x.Object)
	src.tr.GarbageCollect(x.Object, tensors, meta)
	want := []transport.Status{transport.ErrNotFound, transport.ErrPeerUnavailable}
	if s.conf.FreedStatus != 0 {
		want = []transport.Status{s.conf.FreedStatus}
	}
	wantStatus(t, fetch(t, dst, x, s.targets(t, dst, tensors), meta), "a freed object", want...)
}

// A same-host transport reads only from the process the transfer names as
// the source: metadata made by another process (as one on another host
// would be) is refused, never read.
func (s *suite) otherHost(t *testing.T) {
	dst := s.newEnd(t, 0)
	if !dst.desc.SameHostOnly {
		t.Skip("the descriptor says the transport reaches other hosts")
	}
	if s.conf.TrustsSourceProcess != "" {
		t.Skip(s.conf.TrustsSourceProcess)
	}
	src := StartSource(t, 4096)
	other := transport.PeerInfo{Name: "elsewhere", HostID: "another-host", Pid: os.Getpid()}
	_, _ = rand.Read(other.RuntimeID[:])
	target := s.tensor(t, dst, Uint8, 4096, 0)
	wantStatus(t, fetch(t, dst, transfer(SourceObject, dst.desc.Name, other, dst.host.Identity()), []transport.Tensor{target}, src.Meta),
		"metadata of a process the transfer does not name", transport.ErrCorrupt, transport.ErrPermissionDenied, transport.ErrPeerUnavailable, transport.ErrInvalidArgument)
}

func (s *suite) sourceKilled(t *testing.T) {
	t.Run("before", func(t *testing.T) {
		dst := s.newEnd(t, 0)
		src := s.source(t, dst, 4096)
		src.Kill()
		target := s.tensor(t, dst, Uint8, 4096, 0)
		wantStatus(t, fetch(t, dst, transfer(SourceObject, dst.desc.Name, src.Peer, dst.host.Identity()), []transport.Tensor{target}, src.Meta),
			"a killed source", s.conf.sourceGone())
	})
	t.Run("mid_transfer", func(t *testing.T) {
		dst := s.newEnd(t, 0, func(h *Host) { h.Timeout = time.Second })
		src := s.source(t, dst, s.large())
		req, err := start(dst, transfer(SourceObject, dst.desc.Name, src.Peer, dst.host.Identity()), []transport.Tensor{s.largeTensor(t, dst)}, src.Meta)
		s.killDuring(t, src, req, err, "a source killed mid-transfer")
	})
}

// killDuring kills src a moment after a transfer with it started (req,
// err: what starting it returned), then wants the transfer to end as one
// whose source is gone (what says which), or to have finished first.
func (s *suite) killDuring(t *testing.T, src *Source, req transport.Request, err error, what string) {
	t.Helper()
	if err == nil {
		time.Sleep(time.Millisecond)
		src.Kill()
		err = finish(t, req, 30*time.Second)
	}
	if err != nil { // it may have finished before the kill
		wantStatus(t, err, what, s.conf.sourceGone())
	}
}

func (c Config) sourceGone() transport.Status {
	if c.SourceGoneStatus != 0 {
		return c.SourceGoneStatus
	}
	return transport.ErrPeerUnavailable
}
