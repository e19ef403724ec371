package shm

import (
	"bytes"
	"encoding/hex"
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/rdt-project/rdt/core/transport"
	"github.com/rdt-project/rdt/core/transport/transporttest"
)

// owner is a transport whose host admits the writes the test says.
type owner struct {
	tr   *Transport
	host *transporttest.Host
}

func newOwner(t *testing.T) owner { return newOwnerAdmitting(t, map[uint64][]transport.Piece{}) }

// newOwnerAdmitting is an owner whose host admits writes (nil: every
// write).
func newOwnerAdmitting(t *testing.T, writes map[uint64][]transport.Piece) owner {
	h := transporttest.NewHostIn(socketDir(t))
	h.Writes = writes
	tr, err := New(h)
	require.NoError(t, err)
	t.Cleanup(func() { tr.Close() })
	return owner{tr: tr.(*Transport), host: h}
}

// expose makes an object of the given sizes, filled, and its metadata for
// writing.
func (o owner) expose(t *testing.T, id byte, sizes ...int) ([]byte, [][]byte) {
	tensors, mem := transporttest.Filled(t, id, sizes...)
	o.host.Hold(transport.ObjectID{id}, tensors)
	meta, err := o.tr.ExtractExposedMetadata(transport.ObjectID{id}, tensors)
	require.NoError(t, err)
	return meta, mem
}

func (o owner) admit(id uint64, pieces ...transport.Piece) { o.host.Writes[id] = pieces }

// startWrite starts writing sources into the object of meta as write id,
// owned by this process.
func startWrite(t *testing.T, tr *Transport, meta []byte, id uint64, pieces []transport.Piece, sources ...[]byte) (transport.Request, error) {
	var ts []transport.Tensor
	for _, b := range sources {
		buf, x := transporttest.Buffer(t, len(b))
		copy(buf, b)
		ts = append(ts, x)
	}
	m, err := decodeMetadata(meta)
	require.NoError(t, err)
	x := &transport.Transfer{Object: m.Object, TransferID: id, Transport: Name, Role: transport.RoleSource, Direction: transport.Write, Pieces: pieces,
		Destination: transport.PeerInfo{RuntimeID: sourceRuntime, Name: "owner", Pid: os.Getpid()}}
	return tr.Write(x, ts, meta, nil)
}

func writeAndWait(t *testing.T, tr *Transport, meta []byte, id uint64, pieces []transport.Piece, sources ...[]byte) error {
	req, err := startWrite(t, tr, meta, id, pieces, sources...)
	if err != nil {
		return err
	}
	defer req.Release()
	return req.Wait()
}

func pattern(n int, seed byte) []byte {
	b := make([]byte, n)
	transporttest.Fill(b, seed)
	return b
}

// Only writes the owner admitted land, only inside what they were
// admitted for, inline and through the staging area; a refused write
// leaves the connection usable.
func TestWritesLandOnlyWhereAdmitted(t *testing.T) {
	o := newOwner(t)
	meta, mem := o.expose(t, 30, 1000, 20<<20)
	before := [][]byte{bytes.Clone(mem[0]), bytes.Clone(mem[1])}
	o.admit(1)
	o.admit(2, transport.Piece{Tensor: 0, Offset: 100, Length: 50}, transport.Piece{Tensor: 1, Offset: 1 << 20, Length: 3 << 20})
	w := newTransport(t)

	for _, c := range []struct {
		what   string
		id     uint64
		piece  transport.Piece
		status transport.Status
	}{
		{"a write not admitted (inline)", 3, transport.Piece{Tensor: 0, Length: 10}, transport.ErrNotFound},
		{"a write not admitted (staged)", 3, transport.Piece{Tensor: 1, Length: 1 << 20}, transport.ErrNotFound},
		{"outside the admitted ranges (inline)", 2, transport.Piece{Tensor: 0, Offset: 140, Length: 20}, transport.ErrInvalidArgument},
		{"outside the admitted ranges (staged)", 2, transport.Piece{Tensor: 1, Offset: 0, Length: 2 << 20}, transport.ErrInvalidArgument},
	} {
		err := writeAndWait(t, w, meta, c.id, []transport.Piece{c.piece}, make([]byte, c.piece.Length))
		assert.Equal(t, c.status, transport.StatusOf(err), "%s: %v", c.what, err)
	}
	assert.Equal(t, before, mem, "nothing landed")

	patch, big := pattern(50, 7), pattern(3<<20, 8)
	require.NoError(t, writeAndWait(t, w, meta, 2, []transport.Piece{{Tensor: 1, Offset: 1 << 20, Length: 3 << 20}, {Tensor: 0, Offset: 100, Length: 50}}, big, patch))
	want := [][]byte{bytes.Clone(before[0]), bytes.Clone(before[1])}
	copy(want[0][100:], patch)
	copy(want[1][1<<20:], big)
	assert.Equal(t, want, mem)

	// A whole write of several chunks, twice: the second reuses the
	// connection and its staging area.
	for round := byte(0); round < 2; round++ {
		w0, w1 := pattern(1000, 9+round), pattern(20<<20, 10+round)
		require.NoError(t, writeAndWait(t, w, meta, 1, nil, w0, w1))
		assert.True(t, bytes.Equal(w0, mem[0]) && bytes.Equal(w1, mem[1]), "round %d: the whole write landed", round)
		assert.Equal(t, 1, w.peers.wkept.Count(), "round %d: one connection, kept", round)
	}
	assert.Eventually(t, func() bool { return o.host.Pinned() == 0 }, 10*time.Second, time.Millisecond, "every write let go")
}

// An exposed object is not staged: its metadata names no arena or
// segment, and the segment server serves no fetch of it.
func TestExposedObjectIsNotStaged(t *testing.T) {
	o := newOwner(t)
	meta, _ := o.expose(t, 31, 1000, 5<<20)
	m, err := decodeMetadata(meta)
	require.NoError(t, err)
	assert.False(t, m.inArena())
	o.tr.srv.mu.RLock()
	assert.Empty(t, o.tr.srv.segs)
	o.tr.srv.mu.RUnlock()
	_, err = fetch(t, newTransport(t), meta, 1000, 5<<20)
	assert.Equal(t, transport.ErrNotFound, transport.StatusOf(err), "%v", err)
}

// rawWrite sends b to the owner's segment server and reads one reply's
// status; the connection is closed when the test ends.
func rawWrite(t *testing.T, meta []byte, b []byte) (transport.Status, net.Conn) {
	m, err := decodeMetadata(meta)
	require.NoError(t, err)
	c, err := net.Dial("unix", m.Path)
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	_, err = c.Write(b)
	require.NoError(t, err)
	return readStatus(t, c), c
}

func readStatus(t *testing.T, c net.Conn) transport.Status {
	c.SetReadDeadline(time.Now().Add(time.Minute))
	buf := make([]byte, replyLen+maxMessage)
	_, err := io.ReadFull(c, buf[:replyLen])
	require.NoError(t, err)
	h, err := decodeWriteReply(buf[:replyLen])
	require.NoError(t, err)
	_, err = io.ReadFull(c, buf[:h.msgLen])
	require.NoError(t, err)
	return h.status
}

// closedByServer reports whether the server closed c (it sends nothing
// unasked).
func closedByServer(c net.Conn) bool {
	_, err := c.Read(make([]byte, 1))
	return err == io.EOF
}

// Hostile requests and chunks are refused before anything lands, and
// those that leave the connection out of step close it; the server stays
// up.
func TestHostileWritesAreRefused(t *testing.T) {
	o := newOwner(t)
	meta, mem := o.expose(t, 32, 4096, 1<<20)
	before := [][]byte{bytes.Clone(mem[0]), bytes.Clone(mem[1])}
	o.admit(5)
	obj := transport.ObjectID{32}

	tooMany := encodeWriteRequest(obj, 5, nil)
	tooMany[28], tooMany[29], tooMany[30], tooMany[31] = 0xff, 0xff, 0xff, 0xff
	st, c := rawWrite(t, meta, tooMany)
	assert.Equal(t, transport.ErrCorrupt, st, "more pieces than an object may have")
	assert.True(t, closedByServer(c))

	st, c = rawWrite(t, meta, encodeWriteRequest(obj, 5, []transport.Piece{{Tensor: 1, Offset: 8, Length: ^uint64(0) - 4}}))
	assert.Equal(t, transport.ErrCorrupt, st, "a length that wraps")
	assert.True(t, closedByServer(c))

	for _, p := range []transport.Piece{{Tensor: 2, Length: 100 << 10}, {Tensor: 1, Offset: 1 << 20, Length: 100 << 10}, {Tensor: 0, Offset: 4000, Length: 100}} {
		req := encodeWriteRequest(obj, 5, []transport.Piece{p})
		if p.Length <= inlineMax {
			req = append(req, make([]byte, p.Length)...)
		}
		st, c = rawWrite(t, meta, req)
		assert.Equal(t, transport.ErrInvalidArgument, st, "piece %+v outside the object", p)
		// The connection is in step: an empty write on it is answered.
		_, err := c.Write(encodeWriteRequest(obj, 5, []transport.Piece{{Tensor: 0, Length: 0}}))
		require.NoError(t, err)
		assert.Equal(t, transport.OK, readStatus(t, c), "a refused request keeps the connection in step")
	}

	// A chunk longer than its slot, and one in the wrong slot.
	for _, chunk := range [][]byte{encodeChunk(0, 2<<20), encodeChunk(1, 1<<20), []byte("RSXX0123456789ab")} {
		m, err := decodeMetadata(meta)
		require.NoError(t, err)
		c, err := net.Dial("unix", m.Path)
		require.NoError(t, err)
		_, err = c.Write(encodeWriteRequest(obj, 5, []transport.Piece{{Tensor: 1, Length: 1 << 20}}))
		require.NoError(t, err)
		uc := c.(*net.UnixConn)
		w := &wconn{c: uc}
		h, fd, _, err := w.reply(m)
		require.NoError(t, err)
		require.NoError(t, w.mapStaging(fd, h.size))
		_, err = c.Write(chunk)
		require.NoError(t, err)
		_, _, _, err = w.reply(m)
		assert.Equal(t, transport.ErrCorrupt, transport.StatusOf(err), "%v", err)
		w.close()
	}
	assert.Equal(t, before, mem, "nothing landed")
	require.NoError(t, writeAndWait(t, newTransport(t), meta, 5, nil, make([]byte, 4096), make([]byte, 1<<20)))
	assert.Equal(t, [][]byte{make([]byte, 4096), make([]byte, 1<<20)}, mem)
}

// A staging area that is not sealed against resizing, or of a size no
// server makes, is refused before the writer copies into it.
func TestHostileStagingAreasAreRefused(t *testing.T) {
	for _, c := range []struct {
		name   string
		size   uint64
		seal   bool
		status transport.Status
	}{
		{"unsealed", stagingHeader + 2<<20, false, transport.ErrPermissionDenied},
		{"too large", maxStaging + 2, true, transport.ErrCorrupt},
		{"uneven slots", stagingHeader + 3, true, transport.ErrCorrupt},
	} {
		t.Run(c.name, func(t *testing.T) {
			fd := sealedMemfd(t, int(c.size), false)
			if c.seal {
				_, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK|unix.F_SEAL_GROW)
				require.NoError(t, err)
			}
			path := fakeServer(t, func(conn *net.UnixConn, _ []byte) {
				io.ReadFull(conn, make([]byte, writeHeaderLen+pieceLen-requestLen))
				conn.WriteMsgUnix(encodeReply(transport.OK, "", c.size, flagStaging), unix.UnixRights(fd), nil)
				conn.Read(make([]byte, 1)) // until the writer closes
			})
			meta := (&metadata{Path: path, Object: transport.ObjectID{1}, Size: 1 << 20, Regions: []region{{0, 1 << 20}}}).encode()
			err := writeAndWait(t, newTransport(t), meta, 1, nil, make([]byte, 1<<20))
			assert.Equal(t, c.status, transport.StatusOf(err), "%v", err)
		})
	}
}

// An aborted write ends at once, and the owner's server lets go of it:
// it copies nothing more (it sees the abort word or the closed
// connection), so once it let go, the object no longer changes.
func TestAbortedWriteLetsGo(t *testing.T) {
	o := newOwner(t)
	meta, mem := o.expose(t, 33, 256<<20)
	o.admit(1)
	w := newTransport(t)
	req, err := startWrite(t, w, meta, 1, nil, pattern(256<<20, 1))
	require.NoError(t, err)
	for mem[0][0] != 1 && !req.(*writeRequest).Completed() {
		time.Sleep(50 * time.Microsecond) // until the first chunk lands
	}
	w.Abort(nil, req)
	if err := req.Wait(); err != nil {
		assert.Equal(t, transport.ErrAborted, transport.StatusOf(err), "%v", err)
	}
	req.Release()
	assert.Eventually(t, func() bool {
		o.tr.srv.mu.Lock()
		defer o.tr.srv.mu.Unlock()
		return len(o.tr.srv.conns) == 0
	}, 30*time.Second, time.Millisecond, "the server closed the aborted write's connection")
	assert.Equal(t, 0, o.host.Pinned(), "nothing lands any more")
	assert.Equal(t, 0, w.peers.wkept.Count(), "an aborted write's connection is not kept")
}

// A write to an owner that is stopped ends when aborted, without waiting
// for the owner.
func TestWriteToAStoppedOwnerAborts(t *testing.T) {
	src := transporttest.StartExposedSource(t, 64<<20)
	src.Stop()
	defer src.Continue()
	w := newTransport(t)
	_, x := transporttest.Buffer(t, 64<<20)
	xf := &transport.Transfer{Object: transporttest.SourceObject, TransferID: 1, Transport: Name, Role: transport.RoleSource, Direction: transport.Write, Destination: src.Peer}
	req, err := w.Write(xf, []transport.Tensor{x}, src.Meta, nil)
	require.NoError(t, err)
	time.Sleep(10 * time.Millisecond) // the request is sent, its answer awaited
	w.Abort(xf, req)
	done := make(chan error, 1)
	go func() { done <- req.Wait() }()
	select {
	case err := <-done:
		assert.Equal(t, transport.ErrAborted, transport.StatusOf(err), "%v", err)
	case <-time.After(time.Minute):
		t.Fatal("an aborted write to a stopped owner did not end")
	}
	req.Release()
}

// The writer-process role of TestKilledWriterLetsGo.
const writerRoleEnv = "RDT_SHM_TEST_WRITER"

// A writer killed mid-write: the owner's server sees the connection end
// and lets go of the write.
func TestKilledWriterLetsGo(t *testing.T) {
	if v := os.Getenv(writerRoleEnv); v != "" {
		writeForever(t, v)
		return
	}
	o := newOwnerAdmitting(t, nil)
	meta, mem := o.expose(t, 34, 256<<20)
	cmd := exec.Command(os.Args[0], "-test.run=^TestKilledWriterLetsGo$", "-test.count=1")
	cmd.Env = append(os.Environ(), writerRoleEnv+"="+hex.EncodeToString(meta)+":"+strconv.Itoa(os.Getpid()))
	cmd.Stderr = os.Stderr
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	for mem[0][0] != 0xEE {
		time.Sleep(100 * time.Microsecond) // until bytes land
	}
	require.NoError(t, cmd.Process.Kill())
	cmd.Wait()
	assert.Eventually(t, func() bool {
		o.tr.srv.mu.Lock()
		defer o.tr.srv.mu.Unlock()
		return len(o.tr.srv.conns) == 0
	}, 30*time.Second, time.Millisecond, "the server let go of the killed writer's connection")
	assert.Equal(t, 0, o.host.Pinned())
}

// writeForever writes into the object of the metadata until killed.
func writeForever(t *testing.T, arg string) {
	metaHex, pid, _ := strings.Cut(arg, ":")
	meta, err := hex.DecodeString(metaHex)
	require.NoError(t, err)
	w := newTransport(t)
	_, x := transporttest.Buffer(t, 256<<20)
	b := transport.Bytes(x.Data, x.Nbytes)
	b[0] = 0xEE
	for n := 1; n < len(b); n *= 2 {
		copy(b[n:], b[:n])
	}
	owner, err := strconv.Atoi(pid)
	require.NoError(t, err)
	for id := uint64(1); ; id++ {
		xf := &transport.Transfer{Object: transport.ObjectID{34}, TransferID: id, Transport: Name, Role: transport.RoleSource, Direction: transport.Write,
			Destination: transport.PeerInfo{RuntimeID: sourceRuntime, Pid: owner}}
		req, err := w.Write(xf, []transport.Tensor{x}, meta, nil)
		require.NoError(t, err)
		require.NoError(t, req.Wait())
		req.Release()
	}
}
