package tcp

import (
	"bytes"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rdt-project/rdt/core/transport"
	"github.com/rdt-project/rdt/core/transport/transporttest"
)

// write pushes sources into the object of meta as write id.
func (p *pair) write(t testing.TB, meta []byte, id uint64, pieces []transport.Piece, sources ...[]byte) error {
	var ts []transport.Tensor
	for _, b := range sources {
		buf, x := transporttest.Buffer(t, len(b))
		copy(buf, b)
		ts = append(ts, x)
	}
	x := &transport.Transfer{TransferID: id, Role: transport.RoleSource, Direction: transport.Write, Pieces: pieces}
	req, err := p.dst.Write(x, ts, meta, nil)
	if err != nil {
		return err
	}
	return wait(req)
}

// Only a write the owner admitted lands, only inside the ranges admitted,
// and a refused frame's bytes are dropped without breaking the stream: the
// next write on the same pooled connection lands.
func TestWritesLandOnlyWhereAdmitted(t *testing.T) {
	p := newPair(t, "", "")
	meta, contents := p.put(t, 20, 1000, 20<<20)
	before := [][]byte{bytes.Clone(contents[0]), bytes.Clone(contents[1])}
	p.host.Writes = map[uint64][]transport.Piece{
		1: nil, // whole
		2: {{Tensor: 0, Offset: 100, Length: 50}},
	}

	err := p.write(t, meta, 3, []transport.Piece{{Tensor: 0, Offset: 0, Length: 10}}, make([]byte, 10))
	assert.Equal(t, transport.ErrNotFound, transport.StatusOf(err), "a write not admitted: %v", err)
	err = p.write(t, meta, 2, []transport.Piece{{Tensor: 0, Offset: 140, Length: 20}}, make([]byte, 20))
	assert.Equal(t, transport.ErrInvalidArgument, transport.StatusOf(err), "%v", err)
	assert.Contains(t, err.Error(), "outside the ranges the write was admitted for")
	assert.Equal(t, before, [][]byte{contents[0], contents[1]}, "nothing landed")

	patch := bytes.Repeat([]byte{0xAB}, 50)
	require.NoError(t, p.write(t, meta, 2, []transport.Piece{{Tensor: 0, Offset: 100, Length: 50}}, patch))
	want := bytes.Clone(before[0])
	copy(want[100:], patch)
	assert.Equal(t, want, contents[0])

	// A whole write over several streams (20 MiB, past streamMin).
	w0, w1 := make([]byte, 1000), make([]byte, 20<<20)
	transporttest.Fill(w0, 3)
	transporttest.Fill(w1, 4)
	require.NoError(t, p.write(t, meta, 1, nil, w0, w1))
	assert.True(t, bytes.Equal(w0, contents[0]))
	assert.True(t, bytes.Equal(w1, contents[1]))
	assert.Greater(t, p.pooled(), 1, "several streams were used and returned to the pool")
	assert.Eventually(t, func() bool { return p.host.Pinned() == 0 }, 5*time.Second, time.Millisecond, "every write let go")
}

// Hostile write frames: larger than a frame may be, or into several
// tensors, close that connection (their bytes cannot be skipped safely);
// the server stays up.
func TestMalformedWriteFramesCloseOnlyThatConnection(t *testing.T) {
	p := newPair(t, "", "")
	meta, contents := p.put(t, 21, 4096)
	before := bytes.Clone(contents[0])
	for _, bad := range []request{
		{Object: transport.ObjectID{21}, Length: maxWrite + 1, Tag: 5, Write: true},
		{Object: transport.ObjectID{21}, Tensors: 2, Length: 16, Tag: 6, Write: true},
	} {
		c := rawConn(t, p)
		_, err := c.Write(bad.encode(nil))
		require.NoError(t, err)
		st, tag, _, err := readResponse(c)
		require.NoError(t, err)
		assert.Equal(t, transport.ErrInvalidArgument, st)
		assert.Equal(t, bad.Tag, tag)
		_, _, _, err = readResponse(c)
		assert.Error(t, err, "the connection was closed")
	}
	assert.Equal(t, before, contents[0])
	require.NoError(t, p.write(t, meta, 9, nil, make([]byte, 4096)))
	assert.Equal(t, make([]byte, 4096), contents[0])
}

// An aborted write stops sending. Frames it sent before still reach the
// server; once the write is ended (the engine does it when the writer
// reports the abort) they are dropped, and nothing is pinned any more.
func TestAbortedWriteLetsGo(t *testing.T) {
	p := newPair(t, "", "")
	p.host.Writes = map[uint64][]transport.Piece{1: nil}
	meta, _ := p.put(t, 22, 256<<20)
	_, src := transporttest.Buffer(t, 256<<20)
	req, err := p.dst.Write(&transport.Transfer{TransferID: 1, Role: transport.RoleSource, Direction: transport.Write}, []transport.Tensor{src}, meta, nil)
	require.NoError(t, err)
	time.Sleep(time.Millisecond)
	p.dst.Abort(nil, req)
	if err := req.Wait(); err != nil {
		assert.Equal(t, transport.ErrAborted, transport.StatusOf(err), "%v", err)
	}
	req.Release()
	p.host.EndWrite(1)
	assert.Eventually(t, func() bool { return p.host.Pinned() == 0 }, 10*time.Second, time.Millisecond, "the server let go")
	// Whatever was still buffered is refused now: let the server drain it
	// before the test unmaps the object.
	assert.Eventually(t, func() bool {
		p.src.srv.mu.Lock()
		defer p.src.srv.mu.Unlock()
		return len(p.src.srv.sconns) == 0
	}, 10*time.Second, time.Millisecond, "the aborted connections were drained and closed")
}
