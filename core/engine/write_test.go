package engine

import (
	"bytes"
	"encoding/binary"
	"hash/crc32"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/rdt-project/rdt/core/control"
	"github.com/rdt-project/rdt/core/transport"
)

func writablePair(t *testing.T) *pair {
	return newPair(t, func(m *memTransport) { m.ranges, m.writes = true, true })
}

// expose exposes a float32 matrix of 64 rows of 16 elements and 100 bytes
// in the owner, and returns the owner's ref, the writer's ref and the
// exposed buffers (zeroed).
func (p *pair) expose(t *testing.T) (owned, writable *Ref, bufs []*hostBuf) {
	bufs, tensors := matrixAndBytes(t)
	owned, writable = p.exposeTensors(t, tensors...)
	return owned, writable, bufs
}

// matrixAndBytes are new (zeroed) buffers of a float32 matrix of 64 rows
// of 16 elements and of 100 bytes, and the two tensors over them.
func matrixAndBytes(t *testing.T) ([]*hostBuf, []transport.Tensor) {
	t.Helper()
	bufs := []*hostBuf{newHostBuf(t, 64*16*4), newHostBuf(t, 100)}
	return bufs, []transport.Tensor{shaped(t, bufs[0], f32, 64, 16), shaped(t, bufs[1], u8, 100)}
}

// exposeTensors exposes tensors in the owner over "mem" and returns its
// ref and the borrower's writable ref, both released when the test ends.
func (p *pair) exposeTensors(t *testing.T, tensors ...transport.Tensor) (owned, writable *Ref) {
	owned, err := p.owner.Expose(tensors, "mem", nil)
	require.NoError(t, err)
	t.Cleanup(func() { owned.Release() })
	writable = borrowIn(t, p.borrower, owned)
	require.True(t, writable.Desc().Writable)
	return owned, writable
}

// notice waits up to timeout for the next notice of a write into owned,
// which must come.
func notice(t *testing.T, owned *Ref, timeout time.Duration) WriteNotice {
	t.Helper()
	n, err := owned.WaitWriteNotice(timeout)
	require.NoError(t, err)
	return n
}

// assertNoNotice asserts that no notice of a write into owned waits.
func assertNoNotice(t *testing.T, owned *Ref, msgAndArgs ...any) {
	t.Helper()
	_, err := owned.WaitWriteNotice(0)
	assert.Equal(t, transport.ErrTimeout, transport.StatusOf(err), msgAndArgs...)
}

func TestWriteLandsThenNotifies(t *testing.T) {
	p := writablePair(t)
	owned, w, bufs := p.expose(t)
	src, sources := matrixAndBytes(t)
	src[0].fill(3)
	src[1].fill(9)

	require.NoError(t, p.borrower.Write([]*Ref{w}, sources, WriteOptions{Tag: 41}, 10*time.Second))
	n := notice(t, owned, 10*time.Second)
	assert.NoError(t, n.Err)
	assert.Equal(t, uint64(41), n.Tag)
	assert.Equal(t, p.borrower.ID(), n.Writer)
	assert.Equal(t, uint64(64*16*4+100), n.Bytes)
	assert.Equal(t, src[0].b, bufs[0].b)
	assert.Equal(t, src[1].b, bufs[1].b)
	assert.Contains(t, p.dst.Events(), "write")

	assertNoNotice(t, owned, "one write, one notice")
	st := p.borrower.Stats()
	assert.Equal(t, uint64(1), st.WritesCompleted)
	assert.Equal(t, uint64(64*16*4+100), st.BytesWritten)
	assert.Zero(t, st.TransfersCompleted, "a write is not counted as a fetch")
}

func TestPartialWriteTouchesOnlyItsRanges(t *testing.T) {
	p := writablePair(t)
	owned, w, bufs := p.expose(t)
	bufs[0].fill(0x55)
	before := append([]byte(nil), bufs[0].b...)
	row := 16 * 4
	rows := newHostBuf(t, 4*row) // rows 10..13
	rows.fill(0xA0)
	tail := newHostBuf(t, 10) // bytes 90..99 of the second tensor
	tail.fill(0x01)
	dests := []Range{
		{Ref: 0, Piece: transport.Piece{Tensor: 0, Offset: uint64(10 * row), Length: uint64(4 * row)}},
		{Ref: 0, Piece: transport.Piece{Tensor: 1, Offset: 90, Length: RestOfTensor}},
	}
	sources := []transport.Tensor{shaped(t, rows, f32, 4, 16), shaped(t, tail, u8, 10)}
	require.NoError(t, p.borrower.Write([]*Ref{w}, sources, WriteOptions{Tag: 2, Destinations: dests}, 10*time.Second))
	n := notice(t, owned, 10*time.Second)
	require.NoError(t, n.Err)
	assert.Equal(t, uint64(4*row+10), n.Bytes)

	want := append([]byte(nil), before...)
	copy(want[10*row:], rows.b)
	assert.True(t, bytes.Equal(want, bufs[0].b), "only rows 10..13 changed")
	assert.Equal(t, make([]byte, 90), bufs[1].b[:90])
	assert.Equal(t, tail.b, bufs[1].b[90:])
}

func TestWriteRefusalsMoveNothing(t *testing.T) {
	p := writablePair(t)
	owned, w, bufs := p.expose(t)
	src, sources := matrixAndBytes(t)
	src[0].fill(1)
	src[1].fill(2)
	status := func(err error) transport.Status { return transport.StatusOf(err) }

	// Read refs are not written into, writable refs are not fetched.
	put, err := p.owner.Put([]transport.Tensor{shaped(t, src[1], u8, 100)}, "mem", nil)
	require.NoError(t, err)
	defer put.Release()
	assert.Equal(t, transport.ErrInvalidArgument, status(p.owner.Write([]*Ref{put}, sources[1:], WriteOptions{}, time.Second)))
	assert.Equal(t, transport.ErrInvalidArgument, status(p.borrower.Get([]*Ref{w}, sources, FetchOptions{}, time.Second)))

	// Outside the exposed bytes, the wrong dtype, the wrong size.
	out := []Range{{Ref: 0, Piece: transport.Piece{Tensor: 1, Offset: 95, Length: 10}}}
	assert.Equal(t, transport.ErrInvalidArgument, status(p.borrower.Write([]*Ref{w}, []transport.Tensor{shaped(t, newHostBuf(t, 10), u8, 10)}, WriteOptions{Destinations: out}, time.Second)))
	wrongType := []transport.Tensor{shaped(t, src[0], u8, 64*16*4), sources[1]}
	assert.Equal(t, transport.ErrInvalidArgument, status(p.borrower.Write([]*Ref{w}, wrongType, WriteOptions{}, time.Second)))
	short := []transport.Tensor{sources[0], shaped(t, newHostBuf(t, 99), u8, 99)}
	assert.Equal(t, transport.ErrInvalidArgument, status(p.borrower.Write([]*Ref{w}, short, WriteOptions{}, time.Second)))

	// A forged ref: the right object, a guessed key, a valid checksum.
	b, err := owned.Serialize()
	require.NoError(t, err)
	forged := forgeWriteKey(t, b)
	fw, err := p.borrower.Deserialize(forged)
	require.NoError(t, err)
	defer fw.Release()
	err = p.borrower.Write([]*Ref{fw}, sources, WriteOptions{}, 5*time.Second)
	assert.Equal(t, transport.ErrPermissionDenied, status(err), "%v", err)

	// A transport that does not write.
	plain := newMemTransport("plain")
	require.NoError(t, p.borrower.RegisterTransport(plain))
	require.NoError(t, p.owner.RegisterTransport(newMemTransport("plain")))
	err = p.borrower.Write([]*Ref{w}, sources, WriteOptions{Transport: "plain"}, 5*time.Second)
	assert.Equal(t, transport.ErrUnsupported, status(err), "%v", err)

	assert.Equal(t, make([]byte, len(bufs[0].b)), bufs[0].b, "nothing was written")
	assert.Equal(t, make([]byte, len(bufs[1].b)), bufs[1].b, "nothing was written")
	assertNoNotice(t, owned, "refused writes make no notice")
}

// forgeWriteKey changes the write key of serialized writable ref bytes and
// fixes their checksum, as an attacker who read a ref's layout would.
func forgeWriteKey(t *testing.T, b []byte) []byte {
	f := append([]byte(nil), b...)
	require.Equal(t, uint16(flagWritable), binary.LittleEndian.Uint16(f[6:8]))
	keyAt := refHeader + 16 + 16 + 8 // object id, owner id, token
	for i := 0; i < 16; i++ {
		f[keyAt+i] ^= 0x5A
	}
	binary.LittleEndian.PutUint32(f[len(f)-4:], crc32.Checksum(f[:len(f)-4], castagnoli))
	return f
}

func TestAbortedWriteGivesAFailureNotice(t *testing.T) {
	p := writablePair(t)
	p.dst.gate = make(chan struct{}) // the write blocks until aborted
	owned, w, _ := p.expose(t)
	_, sources := matrixAndBytes(t)

	f, err := p.borrower.StartWrite([]*Ref{w}, sources, WriteOptions{Tag: 5})
	require.NoError(t, err)
	require.Eventually(t, func() bool { return p.owner.store.pinned() == 1 }, 10*time.Second, time.Millisecond, "the owner admitted the write")
	assert.Equal(t, transport.ErrTimeout, transport.StatusOf(f.Wait(20*time.Millisecond)))
	f.Abort()
	assert.Equal(t, transport.ErrAborted, transport.StatusOf(f.Wait(-1)))
	f.Free()

	n := notice(t, owned, 10*time.Second)
	assert.Equal(t, uint64(5), n.Tag)
	require.Error(t, n.Err, "an aborted write is never a success")
	assert.Equal(t, transport.ErrAborted, transport.StatusOf(n.Err))
	assert.Zero(t, p.owner.store.pinned(), "an ended write unpins")
	assert.Equal(t, uint64(1), p.borrower.Stats().WritesFailed)
}

func TestWriterGoneTearsItsOpenWrites(t *testing.T) {
	p := writablePair(t)
	owned, _, _ := p.expose(t)
	writer := transport.PeerInfo{RuntimeID: transport.RandomID(), Name: "writer"}
	other := transport.PeerInfo{RuntimeID: transport.RandomID(), Name: "other"}
	open := func(who transport.PeerInfo, id, tag uint64) {
		require.NoError(t, openErr(p.owner.svc.OpenWrite(who, control.WriteOpen{Object: owned.Desc().ID, TransferID: id, Transport: "mem", Key: owned.Desc().WriteKey, Tag: tag})))
	}
	open(writer, 1, 10)
	open(writer, 2, 11)
	open(other, 1, 12)
	assert.Equal(t, 1, p.owner.store.pinned())

	p.owner.svc.PeerGone(writer)
	tags := map[uint64]transport.Status{}
	for i := 0; i < 2; i++ {
		n := notice(t, owned, time.Second)
		require.Error(t, n.Err)
		tags[n.Tag] = transport.StatusOf(n.Err)
		assert.Equal(t, writer.RuntimeID, n.Writer)
	}
	assert.Equal(t, map[uint64]transport.Status{10: transport.ErrPeerUnavailable, 11: transport.ErrPeerUnavailable}, tags)
	assertNoNotice(t, owned, "the other writer's write is still open")
	assert.Equal(t, 1, p.owner.store.pinned(), "still pinned by the other writer")

	// A done for a torn write, or one never opened, changes nothing.
	p.owner.svc.WriteDone(writer.RuntimeID, control.WriteEnd{Object: owned.Desc().ID, TransferID: 1})
	assertNoNotice(t, owned)
	p.owner.svc.WriteDone(other.RuntimeID, control.WriteEnd{Object: owned.Desc().ID, TransferID: 1})
	n := notice(t, owned, time.Second)
	assert.NoError(t, n.Err)
	assert.Equal(t, uint64(12), n.Tag)
	assert.Zero(t, p.owner.store.pinned())
}

func TestRevokeWaitsForOpenWritesThenRefuses(t *testing.T) {
	p := writablePair(t)
	p.dst.gate = make(chan struct{})
	owned, w, _ := p.expose(t)
	_, sources := matrixAndBytes(t)
	f, err := p.borrower.StartWrite([]*Ref{w}, sources, WriteOptions{Tag: 1})
	require.NoError(t, err)
	defer f.Free()
	require.Eventually(t, func() bool { return p.owner.store.pinned() == 1 }, 10*time.Second, time.Millisecond)

	assert.Equal(t, transport.ErrTimeout, transport.StatusOf(owned.RevokeWrites(20*time.Millisecond)), "a write is open")
	close(p.dst.gate)
	require.NoError(t, f.Wait(10*time.Second), "the open write finishes")
	require.NoError(t, owned.RevokeWrites(10*time.Second))
	n := notice(t, owned, time.Second)
	assert.NoError(t, n.Err)

	err = p.borrower.Write([]*Ref{w}, sources, WriteOptions{Tag: 2}, 5*time.Second)
	assert.Equal(t, transport.ErrPermissionDenied, transport.StatusOf(err), "%v", err)
	assert.Contains(t, err.Error(), "revoked")
	_, err = owned.Serialize()
	require.NoError(t, err, "a revoked object's ref still serializes (for the owner's bookkeeping)")
}

func TestNoticesAreBoundedAndOnAnEventFD(t *testing.T) {
	p := writablePair(t)
	owned, _, _ := p.expose(t)
	fd, err := owned.WriteNoticeFD()
	require.NoError(t, err)
	readable := func() bool {
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		n, err := unix.Poll(fds, 0)
		require.NoError(t, err)
		return n == 1
	}
	assert.False(t, readable())

	writer := transport.PeerInfo{RuntimeID: transport.RandomID()}
	req := control.WriteOpen{Object: owned.Desc().ID, Transport: "mem", Key: owned.Desc().WriteKey}
	for i := 0; i < maxPendingNotices; i++ {
		req.TransferID, req.Tag = uint64(i+1), uint64(i)
		require.NoError(t, openErr(p.owner.svc.OpenWrite(writer, req)))
		if i%2 == 0 {
			p.owner.svc.WriteDone(writer.RuntimeID, control.WriteEnd{Object: req.Object, TransferID: req.TransferID})
		}
	}
	req.TransferID++
	err = openErr(p.owner.svc.OpenWrite(writer, req))
	assert.Equal(t, transport.ErrNoMemory, transport.StatusOf(err), "open writes and untaken notices are bounded")
	assert.True(t, readable())
	n := notice(t, owned, 0)
	assert.Equal(t, uint64(0), n.Tag, "oldest first")
	require.NoError(t, openErr(p.owner.svc.OpenWrite(writer, req)), "taking a notice makes room")

	p.owner.svc.PeerGone(writer) // tears the open ones
	for {
		if _, err := owned.WaitWriteNotice(0); err != nil {
			break
		}
	}
	assert.False(t, readable(), "no notice left")
	assert.Zero(t, p.owner.store.pinned())
}

func TestOwnerWritesItsOwnExposedObject(t *testing.T) {
	p := writablePair(t)
	owned, _, bufs := p.expose(t)
	src := newHostBuf(t, 100)
	src.fill(7)
	dests := []Range{{Ref: 0, Piece: transport.Piece{Tensor: 1, Length: RestOfTensor}}}
	require.NoError(t, p.owner.Write([]*Ref{owned}, []transport.Tensor{shaped(t, src, u8, 100)}, WriteOptions{Tag: 3, Destinations: dests}, 5*time.Second))
	assert.Equal(t, src.b, bufs[1].b)
	n := notice(t, owned, time.Second)
	assert.NoError(t, n.Err)
	assert.Equal(t, uint64(3), n.Tag)
	assert.Equal(t, p.owner.ID(), n.Writer)
}

func TestOverlappingWritersEachLandInTheirRanges(t *testing.T) {
	p := writablePair(t)
	owned, w, bufs := p.expose(t)
	third := newRuntime(t, "third")
	m := newMemTransport("mem")
	m.ranges, m.writes = true, true
	require.NoError(t, third.RegisterTransport(m))
	w2 := borrowIn(t, third, owned)

	a, c := newHostBuf(t, 60), newHostBuf(t, 60)
	a.fill(0x11)
	c.fill(0x77)
	da := []Range{{Ref: 0, Piece: transport.Piece{Tensor: 1, Offset: 0, Length: 60}}}
	dc := []Range{{Ref: 0, Piece: transport.Piece{Tensor: 1, Offset: 30, Length: 60}}}
	errs := make(chan error, 2)
	go func() {
		errs <- p.borrower.Write([]*Ref{w}, []transport.Tensor{shaped(t, a, u8, 60)}, WriteOptions{Tag: 1, Destinations: da}, 10*time.Second)
	}()
	go func() {
		errs <- third.Write([]*Ref{w2}, []transport.Tensor{shaped(t, c, u8, 60)}, WriteOptions{Tag: 2, Destinations: dc}, 10*time.Second)
	}()
	require.NoError(t, <-errs)
	require.NoError(t, <-errs)
	for i := 0; i < 2; i++ {
		n := notice(t, owned, time.Second)
		assert.NoError(t, n.Err)
	}
	got := bufs[1].b
	assert.Equal(t, a.b[:30], got[:30], "only the first writer's range")
	assert.Equal(t, c.b[30:], got[60:90], "only the second writer's range")
	for i := 30; i < 60; i++ {
		assert.True(t, got[i] == a.b[i] || got[i] == c.b[i-30], "byte %d of the overlap is one of the writers'", i)
	}
	assert.Equal(t, make([]byte, 10), got[90:], "nothing past the ranges changed")
}

func TestWritableRefRoundTripsItsKey(t *testing.T) {
	p := writablePair(t)
	owned, w, _ := p.expose(t)
	assert.Equal(t, owned.Desc().WriteKey, w.Desc().WriteKey)
	assert.NotEqual(t, WriteKey{}, w.Desc().WriteKey)
	b, err := owned.Serialize()
	require.NoError(t, err)
	d, _, err := DecodeRef(b)
	require.NoError(t, err)
	assert.True(t, d.Writable)

	// Unknown flags and a zero key are corrupt.
	bad := append([]byte(nil), b...)
	binary.LittleEndian.PutUint16(bad[6:8], 3)
	binary.LittleEndian.PutUint32(bad[len(bad)-4:], crc32.Checksum(bad[:len(bad)-4], castagnoli))
	_, _, err = DecodeRef(bad)
	assert.Equal(t, transport.ErrCorrupt, transport.StatusOf(err))
	zero := append([]byte(nil), b...)
	keyAt := refHeader + 16 + 16 + 8
	copy(zero[keyAt:keyAt+16], make([]byte, 16))
	binary.LittleEndian.PutUint32(zero[len(zero)-4:], crc32.Checksum(zero[:len(zero)-4], castagnoli))
	_, _, err = DecodeRef(zero)
	assert.Equal(t, transport.ErrCorrupt, transport.StatusOf(err))
}

// A server landing a write's bytes (WriteInto) holds its notice and its
// pin: a write ended or torn meanwhile is finished when the server lets go,
// so nothing lands after the notice.
func TestNoticeWaitsForTheServerLandingTheBytes(t *testing.T) {
	p := writablePair(t)
	owned, _, _ := p.expose(t)
	id := owned.Desc().ID
	writer := transport.PeerInfo{RuntimeID: transport.RandomID()}
	pieces := []transport.Piece{{Tensor: 1, Offset: 10, Length: 20}}
	require.NoError(t, openErr(p.owner.svc.OpenWrite(writer, control.WriteOpen{Object: id, TransferID: 7, Transport: "mem", Key: owned.Desc().WriteKey, Tag: 70, Pieces: pieces})))

	tensors, got, done, err := p.owner.host.WriteInto(id, 7)
	require.NoError(t, err)
	assert.Len(t, tensors, 2)
	assert.Equal(t, pieces, got)
	_, _, _, err = p.owner.host.WriteInto(id, 8)
	assert.Equal(t, transport.ErrNotFound, transport.StatusOf(err), "only open writes land")

	p.owner.svc.WriteDone(writer.RuntimeID, control.WriteEnd{Object: id, TransferID: 7})
	assertNoNotice(t, owned, "the server still lands bytes")
	_, _, _, err = p.owner.host.WriteInto(id, 7)
	assert.Equal(t, transport.ErrNotFound, transport.StatusOf(err), "an ended write takes no more bytes")
	assert.Equal(t, uint64(1), p.owner.Stats().WritesOpen)
	done()
	done() // once only
	n := notice(t, owned, time.Second)
	assert.NoError(t, n.Err)
	assert.Equal(t, uint64(70), n.Tag)
	assert.Zero(t, p.owner.store.pinned())

	// Torn while a server lands bytes: the failure notice waits too.
	require.NoError(t, openErr(p.owner.svc.OpenWrite(writer, control.WriteOpen{Object: id, TransferID: 9, Transport: "mem", Key: owned.Desc().WriteKey, Tag: 90})))
	_, _, done, err = p.owner.host.WriteInto(id, 9)
	require.NoError(t, err)
	p.owner.svc.PeerGone(writer)
	assertNoNotice(t, owned)
	done()
	n = notice(t, owned, time.Second)
	assert.Equal(t, transport.ErrPeerUnavailable, transport.StatusOf(n.Err))
	assert.Zero(t, p.owner.store.pinned())

	// Exposed objects are never served for reading.
	_, _, err = p.owner.host.PinObject(id)
	assert.Equal(t, transport.ErrPermissionDenied, transport.StatusOf(err))
}

// An owner destroyed with writes open (their outcomes can no longer come)
// tears them and does not wait for them.
func TestDestroyTearsOpenWrites(t *testing.T) {
	p := writablePair(t)
	owned, _, _ := p.expose(t)
	writer := transport.PeerInfo{RuntimeID: transport.RandomID()}
	require.NoError(t, openErr(p.owner.svc.OpenWrite(writer, control.WriteOpen{Object: owned.Desc().ID, TransferID: 1, Transport: "mem", Key: owned.Desc().WriteKey})))
	done := make(chan struct{})
	go func() { p.owner.Destroy(); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("destroy waited for a write that cannot end")
	}
	_, err := owned.WaitWriteNotice(0)
	assert.Error(t, err, "the object is gone with its notices")
}

// A write the owner admitted that its transport then fails is not tried
// again over the next transport of the automatic choice: the owner's one
// notice for it says it failed, and nothing stays open.
func TestAdmittedWriteIsNotRetriedElsewhere(t *testing.T) {
	auto := func(rank int) func(*transport.Descriptor) {
		return func(d *transport.Descriptor) { d.Auto = transport.AutoRank{Host: rank} }
	}
	p := newPair(t, func(m *memTransport) { m.ranges, m.writes, m.describe = true, true, auto(1) })
	p.dst.failWrite = transport.Errorf(transport.ErrUnsupported, "this write cannot go this way")
	second := newMemTransport("mem2")
	second.writes, second.describe = true, auto(2)
	require.NoError(t, p.borrower.RegisterTransport(second))
	other := newMemTransport("mem2")
	other.writes, other.describe = true, auto(2)
	require.NoError(t, p.owner.RegisterTransport(other))

	buf := newHostBuf(t, 64)
	owned, err := p.owner.Expose([]transport.Tensor{shaped(t, buf, u8, 64)}, "", nil)
	require.NoError(t, err)
	defer owned.Release()
	w := borrowIn(t, p.borrower, owned)

	err = p.borrower.Write([]*Ref{w}, []transport.Tensor{shaped(t, newHostBuf(t, 64), u8, 64)}, WriteOptions{Tag: 4}, 10*time.Second)
	assert.Equal(t, transport.ErrUnsupported, transport.StatusOf(err), "%v", err)
	n := notice(t, owned, 10*time.Second)
	assert.Error(t, n.Err)
	assert.Equal(t, uint64(4), n.Tag)
	assert.NotContains(t, second.Events(), "write", "not tried over the next transport")
	assert.Zero(t, p.owner.Stats().WritesOpen)
}

// openErr is OpenWrite's error alone, for the tests that do not look at
// the metadata it answers with.
func openErr(_ control.Admission, err error) error { return err }

// Where an exposed object lies (its transport metadata) is told only to a
// write its key admits: never to a metadata request, nor to a wrong key.
func TestExposedMetadataGoesOnlyWithTheKey(t *testing.T) {
	p := writablePair(t)
	owned, _, _ := p.expose(t)
	id := owned.Desc().ID
	writer := transport.PeerInfo{RuntimeID: transport.RandomID(), Name: "writer"}

	meta, err := p.owner.svc.Metadata(writer.RuntimeID, id, "mem")
	assert.Equal(t, transport.ErrPermissionDenied, transport.StatusOf(err), "%v", err)
	assert.Nil(t, meta)

	wrong := control.WriteOpen{Object: id, TransferID: 1, Transport: "mem", Key: [16]byte{1}}
	adm, err := p.owner.svc.OpenWrite(writer, wrong)
	assert.Equal(t, transport.ErrPermissionDenied, transport.StatusOf(err), "%v", err)
	assert.Nil(t, adm.Meta)

	right := control.WriteOpen{Object: id, TransferID: 2, Transport: "mem", Key: owned.Desc().WriteKey}
	adm, err = p.owner.svc.OpenWrite(writer, right)
	require.NoError(t, err)
	assert.NotEmpty(t, adm.Meta, "the admitted write gets the object's metadata")
	p.owner.svc.WriteDone(writer.RuntimeID, control.WriteEnd{Object: id, TransferID: 2})
	n := notice(t, owned, time.Second)
	assert.NoError(t, n.Err)
}

// Plain writes into one object over one transport at the same ranges
// share a standing admission: the owner admits the first, the others only
// announce their runs, and each still gets its own notice with its tag.
// Other ranges are admitted apart. Without a run for heldIdle the
// admission closes, with no notice, and the object is unpinned.
func TestPlainWritesShareAHeldAdmission(t *testing.T) {
	p := writablePair(t)
	owned, w, bufs := p.expose(t)
	src, sources := matrixAndBytes(t)
	var first []openKey
	for tag := uint64(1); tag <= 4; tag++ {
		src[0].fill(byte(tag))
		require.NoError(t, p.borrower.Write([]*Ref{w}, sources, WriteOptions{Tag: tag}, 5*time.Second))
		n := notice(t, owned, 5*time.Second)
		assert.NoError(t, n.Err)
		assert.Equal(t, tag, n.Tag)
		assert.Equal(t, src[0].b, bufs[0].b)
		keys := standingKeys(t, owned)
		require.Len(t, keys, 1, "one admission stays open between writes")
		if first == nil {
			first = keys
		}
		assert.Equal(t, first, keys, "write %d asked for no new admission", tag)
	}
	assert.Equal(t, 1, p.owner.store.pinned(), "the held admission pins the object")

	part := []Range{{Ref: 0, Piece: transport.Piece{Tensor: 1, Offset: 0, Length: 100}}}
	require.NoError(t, p.borrower.Write([]*Ref{w}, sources[1:], WriteOptions{Tag: 9, Destinations: part}, 5*time.Second))
	assert.Equal(t, uint64(9), notice(t, owned, 5*time.Second).Tag)
	assert.Len(t, standingKeys(t, owned), 2, "other ranges have their own admission")

	require.Eventually(t, func() bool { return len(standingKeys(t, owned)) == 0 }, 10*time.Second, 5*time.Millisecond,
		"idle admissions close")
	assertNoNotice(t, owned, "an idle admission closes without a notice")
	assert.Zero(t, p.owner.store.pinned())
}

// A writer that lets go of the writable ref closes its held admission at
// once: the owner's object is not kept pinned until the idle close.
func TestReleasingTheWritableRefClosesItsHeldAdmission(t *testing.T) {
	p := writablePair(t)
	owned, w, _ := p.expose(t) // the writer's only handle
	_, sources := matrixAndBytes(t)
	require.NoError(t, p.borrower.Write([]*Ref{w}, sources, WriteOptions{Tag: 3}, 5*time.Second))
	assert.Equal(t, uint64(3), notice(t, owned, 5*time.Second).Tag)
	require.Len(t, standingKeys(t, owned), 1)
	require.NoError(t, w.Release())
	assert.Empty(t, standingKeys(t, owned))
	assert.Zero(t, p.owner.store.pinned())
	assertNoNotice(t, owned)
}

// A plain write that fails under a held admission closes it with the
// write's failure notice (its tag); the next write is admitted anew.
func TestFailedWriteClosesItsHeldAdmission(t *testing.T) {
	p := writablePair(t)
	owned, w, _ := p.expose(t)
	_, sources := matrixAndBytes(t)
	require.NoError(t, p.borrower.Write([]*Ref{w}, sources, WriteOptions{Tag: 1}, 5*time.Second))
	notice(t, owned, 5*time.Second)
	held := standingKeys(t, owned)
	require.Len(t, held, 1)

	p.dst.waitErr = func(*transport.Transfer) error { return transport.Errorf(transport.ErrTransport, "the link broke") }
	err := p.borrower.Write([]*Ref{w}, sources, WriteOptions{Tag: 2}, 5*time.Second)
	assert.Equal(t, transport.ErrTransport, transport.StatusOf(err), "%v", err)
	n := notice(t, owned, 5*time.Second)
	assert.Equal(t, uint64(2), n.Tag)
	assert.Equal(t, transport.ErrTransport, transport.StatusOf(n.Err), "%v", n.Err)
	assert.Empty(t, standingKeys(t, owned), "a failed run closes the admission")

	p.dst.waitErr = nil
	require.NoError(t, p.borrower.Write([]*Ref{w}, sources, WriteOptions{Tag: 3}, 5*time.Second))
	assert.Equal(t, uint64(3), notice(t, owned, 5*time.Second).Tag)
	again := standingKeys(t, owned)
	require.Len(t, again, 1)
	assert.NotEqual(t, held, again, "the next write was admitted anew")
}
