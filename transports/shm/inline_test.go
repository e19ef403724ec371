package shm

import (
	"bytes"
	"encoding/binary"
	"io"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/rdt-project/rdt/core/transport"
	"github.com/rdt-project/rdt/core/transport/transporttest"
)

// A small object comes inline on the kept connection, straight into the
// targets (no descriptor), whether it is one tensor or several with
// alignment padding between them; a caller without targets still gets the
// descriptor.
func TestSmallObjectsComeInline(t *testing.T) {
	src, dst := newSegmentTransport(t), newTransport(t)
	for i, sizes := range [][]int{{4096}, {1, 100, 0, 3000, 7}, {inlineMax}} {
		meta, want := stageObject(t, src, byte(i+1), sizes...)
		m, err := decodeMetadata(meta)
		require.NoError(t, err)
		kept, err := dst.peers.record(transport.PeerInfo{RuntimeID: sourceRuntime})
		require.NoError(t, err)
		targets, got := transporttest.Buffers(t, sizes...)
		a, err := dst.rcv.getSegment(nil, kept, os.Getpid(), m, targets, false)
		require.NoError(t, err)
		assert.Nil(t, a.pending)
		assert.Equal(t, -1, a.fd, "no descriptor: the bytes came inline")
		assert.Equal(t, m.Size, a.size)
		sameBytes(t, want, got)

		a, err = dst.rcv.getSegment(nil, kept, os.Getpid(), m, nil, false)
		require.NoError(t, err)
		assert.GreaterOrEqual(t, a.fd, 0, "without targets the descriptor is handed out")
		unix.Close(a.fd)

		got2, err := fetch(t, dst, meta, sizes...)
		require.NoError(t, err)
		sameBytes(t, want, got2)
	}
	assert.Equal(t, 1, dst.peers.count(), "every request went over one kept connection")
}

func sameBytes(t *testing.T, want, got [][]byte) {
	t.Helper()
	require.Len(t, got, len(want))
	for i := range want {
		assert.True(t, bytes.Equal(want[i], got[i]), "tensor %d differs", i)
	}
}

func TestInlineObjectFreedIsNotFound(t *testing.T) {
	src, dst := newTransport(t), newTransport(t)
	meta, want := stageObject(t, src, 9, 4096)
	fetched(t, dst, meta, want)
	src.GarbageCollect(transport.ObjectID{9}, nil, meta)
	got, err := fetch(t, dst, meta, 4096)
	assert.Equal(t, transport.ErrNotFound, transport.StatusOf(err), "%v", err)
	assert.True(t, allZero(got[0]))
}

// A stopped source leaves a small fetch pending after syncWait, not
// blocking Fetch; Abort ends it at once.
func TestInlineFetchOfAStoppedSourceAborts(t *testing.T) {
	src := transporttest.StartSource(t, 4096)
	dst := newTransport(t)
	src.Stop()
	defer src.Continue()
	_, target := transporttest.Buffer(t, 4096)
	x := &transport.Transfer{Object: transporttest.SourceObject, Transport: Name, Role: transport.RoleDestination, Source: src.Peer}
	began := time.Now()
	req, err := dst.Fetch(x, []transport.Tensor{target}, src.Meta, nil)
	require.NoError(t, err)
	defer req.Release()
	assert.Less(t, time.Since(began), transporttest.Margin, "Fetch does not wait for a stopped source")
	dst.Abort(x, req)
	done := make(chan error, 1)
	go func() { done <- req.Wait() }()
	select {
	case err = <-done:
		assert.Equal(t, transport.ErrAborted, transport.StatusOf(err), "%v", err)
	case <-time.After(transporttest.Margin):
		t.Fatal("the aborted fetch did not end")
	}
}

// A source killed after a small fetch leaves a kept connection to a dead
// server: the next fetch says the source is gone.
func TestInlineFetchOfAKilledSource(t *testing.T) {
	src := transporttest.StartSource(t, 4096)
	dst := newTransport(t)
	x := &transport.Transfer{Object: transporttest.SourceObject, Transport: Name, Role: transport.RoleDestination, Source: src.Peer}
	got, err := fetchWith(t, dst, x, src.Meta, 4096)
	require.NoError(t, err)
	assert.Equal(t, src.Want[0], got)
	assert.Equal(t, 1, dst.peers.count())
	src.Kill()
	_, err = fetchWith(t, dst, x, src.Meta, 4096)
	assert.Equal(t, transport.ErrPeerUnavailable, transport.StatusOf(err), "%v", err)
}

// fakeServer answers each connection's first request with reply, then
// closes it. It runs in this process, so it passes the owner check of a
// transfer whose source is this process.
func fakeServer(t *testing.T, reply func(c *net.UnixConn, req []byte)) string {
	path := filepath.Join(socketDir(t), "fake.sock")
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	require.NoError(t, err)
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.AcceptUnix()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				req := make([]byte, requestLen)
				if _, err := io.ReadFull(c, req); err == nil {
					reply(c, req)
				}
			}()
		}
	}()
	return path
}

func sealedMemfd(t *testing.T, size int, seal bool) int {
	fd, err := unix.MemfdCreate("rdt-test", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	require.NoError(t, err)
	t.Cleanup(func() { unix.Close(fd) })
	require.NoError(t, unix.Ftruncate(fd, int64(size)))
	if seal {
		_, err = unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK|unix.F_SEAL_GROW|unix.F_SEAL_WRITE)
		require.NoError(t, err)
	}
	return fd
}

// A hostile or broken source never makes a receiver crash or write past
// what it announced: every malformed reply is refused, and the target is
// not written.
func TestHostileRepliesAreRefused(t *testing.T) {
	const size = 4096
	inline := func(n uint64, payload int) []byte {
		return append(encodeReply(transport.OK, "", n, flagInline), make([]byte, payload)...)
	}
	unsealed := sealedMemfd(t, 2*inlineMax, false)
	sealed := sealedMemfd(t, size, true)
	for _, c := range []struct {
		name   string
		size   uint64 // the metadata's
		reply  func(c *net.UnixConn, req []byte)
		status transport.Status
		inStep bool // the reply was well formed: the connection may be kept
	}{
		{"bigger than announced", size, func(c *net.UnixConn, _ []byte) { c.Write(inline(size*2, size*2)) }, transport.ErrCorrupt, false},
		{"smaller than the metadata", size, func(c *net.UnixConn, _ []byte) { c.Write(inline(size/2, size/2)) }, transport.ErrCorrupt, false},
		{"short", size, func(c *net.UnixConn, _ []byte) { c.Write(inline(size, 100)) }, transport.ErrPeerUnavailable, false},
		{"inline not asked for", 2 * inlineMax, func(c *net.UnixConn, _ []byte) { c.Write(inline(2*inlineMax, 100)) }, transport.ErrCorrupt, false},
		{"inline with a descriptor", size, func(c *net.UnixConn, _ []byte) {
			c.WriteMsgUnix(inline(size, size), unix.UnixRights(sealed), nil)
		}, transport.ErrCorrupt, false},
		{"longer than it says", size, func(c *net.UnixConn, _ []byte) {
			c.WriteMsgUnix(append(encodeReply(transport.OK, "", size, 0), 1, 2, 3), unix.UnixRights(sealed), nil)
		}, transport.ErrCorrupt, false},
		{"unknown flags", size, func(c *net.UnixConn, _ []byte) { c.Write(encodeReply(transport.OK, "", size, 6)) }, transport.ErrCorrupt, false},
		{"message too long", size, func(c *net.UnixConn, _ []byte) {
			b := encodeReply(transport.OK, "", size, 0)
			binary.LittleEndian.PutUint32(b[20:], maxMessage+1)
			c.Write(b)
		}, transport.ErrCorrupt, false},
		{"older protocol", size, func(c *net.UnixConn, _ []byte) { c.Write(encodeReplyV1(transport.OK, "")) }, transport.ErrCorrupt, false},
		{"unsealed segment", 2 * inlineMax, func(c *net.UnixConn, _ []byte) {
			c.WriteMsgUnix(encodeReply(transport.OK, "", 2*inlineMax, 0), unix.UnixRights(unsealed), nil)
		}, transport.ErrPermissionDenied, true},
		{"no descriptor", 2 * inlineMax, func(c *net.UnixConn, _ []byte) { c.Write(encodeReply(transport.OK, "", 2*inlineMax, 0)) }, transport.ErrCorrupt, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			path := fakeServer(t, c.reply)
			meta := (&metadata{Path: path, Object: transport.ObjectID{1}, Size: c.size, Regions: []region{{0, c.size}}}).encode()
			dst := newTransport(t)
			got, err := fetchWith(t, dst, transferOf(t, meta), meta, int(c.size))
			assert.Equal(t, c.status, transport.StatusOf(err), "%v", err)
			assert.True(t, allZero(got), "the target was not written")
			if !c.inStep {
				assert.Equal(t, 0, dst.peers.count(), "a connection out of step is not kept")
			}
		})
	}
}

// A receiver of protocol version 1 is told the versions differ.
func TestVersion1RequestIsAnswered(t *testing.T) {
	src := newTransport(t)
	meta, _ := stageObject(t, src, 1, 100)
	m, err := decodeMetadata(meta)
	require.NoError(t, err)
	c, err := net.Dial("unix", m.Path)
	require.NoError(t, err)
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	_, err = c.Write(append([]byte(requestMagicV1), m.Object[:]...))
	require.NoError(t, err)
	reply, err := io.ReadAll(c)
	require.NoError(t, err)
	require.GreaterOrEqual(t, len(reply), 16)
	assert.Equal(t, transport.ErrUnsupported, transport.Status(int32(binary.LittleEndian.Uint32(reply))))
	assert.Contains(t, string(reply[16:]), "protocol version 2")
}

// shrinkAndSeal is what a hostile source does to a memfd it handed out,
// between a receiver's checks: shrink it to nothing, then seal it as the
// receiver requires. A receiver that read the size first passed both
// checks and died of SIGBUS on its first read of the mapping.
func shrinkAndSeal(t *testing.T) (attacked func() bool) {
	var did bool
	betweenSealsAndSize = func(fd int) {
		if unix.Ftruncate(fd, 0) == nil {
			unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK|unix.F_SEAL_GROW|unix.F_SEAL_WRITE)
			did = true
		}
	}
	t.Cleanup(func() { betweenSealsAndSize = nil })
	return func() bool { return did }
}

// A segment that is unsealed when the receiver looks is refused before its
// size is read, so a source resizing it in between gains nothing.
func TestSegmentResizedBetweenChecksIsRefused(t *testing.T) {
	attacked := shrinkAndSeal(t)
	size := 2 * inlineMax
	memfd := sealedMemfd(t, size, false)
	path := fakeServer(t, func(c *net.UnixConn, _ []byte) {
		c.WriteMsgUnix(encodeReply(transport.OK, "", uint64(size), 0), unix.UnixRights(memfd), nil)
	})
	meta := (&metadata{Path: path, Object: transport.ObjectID{1}, Size: uint64(size), Regions: []region{{0, uint64(size)}}}).encode()
	got, err := fetchWith(t, newTransport(t), transferOf(t, meta), meta, size)
	assert.Equal(t, transport.ErrPermissionDenied, transport.StatusOf(err), "%v", err)
	assert.True(t, allZero(got), "the target was not written")
	assert.False(t, attacked(), "the size was never read of a file that could still change")
}

// The same for the arena: mapping an arena that could still shrink is
// refused, and one sealed before the checks cannot be shrunk.
func TestArenaResizedBetweenChecksIsRefused(t *testing.T) {
	attacked := shrinkAndSeal(t)
	size := uint64(arenaTable + 4096)
	unsealed := sealedMemfd(t, int(size), false)
	v, err := mapArena(dupFd(t, unsealed), size, os.Getpid())
	if err == nil {
		_, target := transporttest.Buffer(t, 16)
		v.read(&metadata{Object: transport.ObjectID{1}, Base: arenaTable, Size: 16, Regions: []region{{0, 16}}}, []transport.Tensor{target})
		v.unmap()
	}
	assert.Equal(t, transport.ErrPermissionDenied, transport.StatusOf(err), "%v", err)
	assert.False(t, attacked())

	sealed := sealedMemfd(t, int(size), true)
	v, err = mapArena(dupFd(t, sealed), size, os.Getpid())
	require.NoError(t, err)
	v.unmap()
	assert.False(t, attacked(), "a sealed arena cannot be shrunk")
}

func dupFd(t *testing.T, fd int) int {
	d, err := unix.Dup(fd)
	require.NoError(t, err)
	return d
}
