package tcp

import (
	"io"
	"net"
	"sort"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rdt-project/rdt/core/transport"
	"github.com/rdt-project/rdt/core/transport/transporttest"
)

// partialFetch fetches pieces of the object meta names into guarded
// targets.
func partialFetch(t *testing.T, d *Transport, meta []byte, pieces []transport.Piece) ([]transporttest.Guarded, error) {
	var gs []transporttest.Guarded
	var targets []transport.Tensor
	for _, p := range pieces {
		g := transporttest.GuardedTarget(t, int(p.Length))
		gs = append(gs, g)
		targets = append(targets, g.Target)
	}
	req, err := d.Fetch(&transport.Transfer{Pieces: pieces}, targets, meta, nil)
	if err != nil {
		return gs, err
	}
	return gs, wait(req)
}

// sourceByte is byte off of tensor i of the recording source's object.
func sourceByte(i uint32, off uint64) byte { return byte(off*7) ^ byte(i*29) ^ byte(off>>10) }

// A partial fetch asks the source for exactly its pieces' bytes: each
// piece's range, whole or cut for the streams, small pieces pipelined on
// one connection, nothing for an empty piece; and each target receives its
// piece and nothing around it.
func TestPartialFetchAsksForExactlyThePieces(t *testing.T) {
	var mu sync.Mutex
	var asked []request
	ep := fakeSource(t, "", func(c net.Conn) {
		frame := make([]byte, requestLen)
		for {
			if _, err := io.ReadFull(c, frame); err != nil {
				return
			}
			req, err := decodeRequest(frame)
			if err != nil {
				return
			}
			mu.Lock()
			asked = append(asked, req)
			mu.Unlock()
			out := encodeResponse(nil, req.Tag, transport.OK, "")
			for k := uint64(0); k < req.Length; k++ {
				out = append(out, sourceByte(req.Tensor, req.Offset+k))
			}
			if _, err := c.Write(out); err != nil {
				return
			}
		}
	})
	d, err := New(newHost(""))
	require.NoError(t, err)
	defer d.Close()
	pieces := []transport.Piece{
		{Tensor: 3, Offset: 1<<20 + 5, Length: streamMin + 4097}, // over several streams
		{Tensor: 0, Offset: 4000, Length: 96},
		{Tensor: 0, Offset: 4096, Length: 4096}, // right after the previous
		{Tensor: 2, Offset: 7, Length: 0},       // empty: not asked for
		{Tensor: 1, Offset: 0, Length: 1},
		{Tensor: 0, Offset: 0, Length: 100},
	}
	gs, err := partialFetch(t, d.(*Transport), fakeMeta(ep, 4), pieces)
	require.NoError(t, err)
	for i, p := range pieces {
		want := make([]byte, p.Length)
		for k := range want {
			want[k] = sourceByte(p.Tensor, p.Offset+uint64(k))
		}
		gs[i].Check(t, want, "piece")
	}

	// The large piece's requests tile its range; every other piece with
	// bytes is one request for exactly its range; nothing else is asked.
	type span struct {
		tensor   uint32
		off, end uint64
	}
	var large, small, want []span
	mu.Lock()
	defer mu.Unlock()
	for _, r := range asked {
		assert.Equal(t, transport.ObjectID{0xfa}, r.Object)
		s := span{r.Tensor, r.Offset, r.Offset + r.Length}
		if r.Tensor == pieces[0].Tensor {
			large = append(large, s)
		} else {
			small = append(small, s)
		}
	}
	for _, p := range pieces[1:] {
		if p.Length > 0 {
			want = append(want, span{p.Tensor, p.Offset, p.End()})
		}
	}
	byPlace := func(s []span) {
		sort.Slice(s, func(i, j int) bool {
			return s[i].tensor < s[j].tensor || s[i].tensor == s[j].tensor && s[i].off < s[j].off
		})
	}
	byPlace(large)
	byPlace(small)
	byPlace(want)
	assert.Equal(t, want, small)
	assert.Greater(t, len(large), 1, "the large piece was cut for the streams")
	next := pieces[0].Offset
	for _, s := range large {
		assert.Equal(t, next, s.off, "the large piece's requests tile it")
		assert.LessOrEqual(t, s.end-s.off, uint64(maxChunk))
		next = s.end
	}
	assert.Equal(t, pieces[0].End(), next)
}

// Ranges outside the source's tensors, which tcp's metadata (a count, no
// sizes) cannot show: the source refuses them (INVALID_ARGUMENT) and
// sends no byte of them, so nothing around the target is written (its
// refusal's message may be read ahead into the target); the source goes
// on serving. Pieces the metadata does
// show wrong (a tensor past its count, a wrapping range, a target of
// another length) are refused before anything is asked.
func TestPartialFetchOutsideATensorIsRefused(t *testing.T) {
	p := newPair(t, "", "")
	meta, want := p.put(t, 11, 4096, 100)
	for _, c := range []struct {
		what   string
		pieces []transport.Piece
	}{
		{"bytes past the end", []transport.Piece{{Tensor: 1, Offset: 90, Length: 16}}},
		{"an offset past the end", []transport.Piece{{Tensor: 0, Offset: 1 << 40, Length: 1}}},
		{"a bad piece after good ones", []transport.Piece{{Tensor: 0, Offset: 0, Length: 16}, {Tensor: 1, Offset: 0, Length: 100}, {Tensor: 0, Offset: 4090, Length: 7}}},
	} {
		gs, err := partialFetch(t, p.dst, meta, c.pieces)
		assert.Equal(t, transport.ErrInvalidArgument, transport.StatusOf(err), "%s: %v", c.what, err)
		assert.Contains(t, err.Error(), "outside tensor", c.what)
		for _, g := range gs {
			g.CheckGuards(t, c.what)
		}
	}
	for _, c := range []struct {
		what  string
		piece transport.Piece
		n     int
	}{
		{"a tensor the source lacks", transport.Piece{Tensor: 2, Length: 16}, 16},
		{"a length that wraps", transport.Piece{Tensor: 0, Offset: 8, Length: ^uint64(0) - 4}, 16},
		{"a target of another length", transport.Piece{Tensor: 0, Length: 32}, 16},
	} {
		g := transporttest.GuardedTarget(t, c.n)
		_, err := p.dst.Fetch(&transport.Transfer{Pieces: []transport.Piece{c.piece}}, []transport.Tensor{g.Target}, meta, nil)
		assert.Equal(t, transport.ErrInvalidArgument, transport.StatusOf(err), "%s: %v", c.what, err)
		g.Check(t, nil, c.what)
	}
	pieces := []transport.Piece{{Tensor: 1, Offset: 99, Length: 1}, {Tensor: 0, Offset: 10, Length: 4086}}
	gs, err := partialFetch(t, p.dst, meta, pieces)
	require.NoError(t, err, "the source still serves")
	for i, pc := range pieces {
		gs[i].Check(t, want[pc.Tensor][pc.Offset:pc.End()], "after the refusals")
	}
}
