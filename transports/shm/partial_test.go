package shm

import (
	"fmt"
	"os"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/rdt-project/rdt/core/transport"
	"github.com/rdt-project/rdt/core/transport/transporttest"
)

// A partial fetch lands its pieces, in any order, wherever the object was
// staged: in the arena (copied from the mapping, the arena asked for at the
// first fetch and not after), in a segment small enough to come inline
// (which a partial fetch takes as a descriptor instead, reading only the
// pieces), and in a larger segment (preadv, and a mapping for a large
// piece misaligned with its target).
func TestPartialFetchOfEveryStorage(t *testing.T) {
	for _, c := range []struct {
		name            string
		src             *Transport
		sizes           []int
		inArena, inline bool
	}{
		{"arena", newTransport(t), []int{4096, 1 << 20, 100}, true, false},
		{"small segment", newSegmentTransport(t), []int{4096, 3000, 100}, false, true},
		{"segment", newSegmentTransport(t), []int{64 << 10, 5 << 20, 100}, false, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			meta, want := stageObject(t, c.src, 1, c.sizes...)
			m := arenaOf(t, meta)
			require.Equal(t, c.inArena, m.inArena(), "staged in the arena")
			require.Equal(t, c.inline, !m.inArena() && m.Size <= inlineMax, "small enough to come inline in a whole fetch")
			n1 := uint64(c.sizes[1])
			pieces := []transport.Piece{
				{Tensor: 1, Offset: 17, Length: n1 / 2},            // odd offset, misaligned with the target
				{Tensor: 0, Offset: 0, Length: uint64(c.sizes[0])}, // a whole tensor
				{Tensor: 2, Offset: 99, Length: 1},                 // the last byte
				{Tensor: 1, Offset: n1 - 8, Length: 8},             // the end of a tensor
				{Tensor: 0, Offset: 64, Length: 0},                 // empty
				{Tensor: 1, Offset: 0, Length: 16},                 // a tensor again
			}
			dst := newTransport(t)
			for round := 0; round < 2; round++ {
				var gs []transporttest.Guarded
				var targets []transport.Tensor
				for _, p := range pieces {
					g := transporttest.GuardedTarget(t, int(p.Length))
					gs = append(gs, g)
					targets = append(targets, g.Target)
				}
				x := transferOf(t, meta)
				x.Pieces = pieces
				req, err := dst.Fetch(x, targets, meta, nil)
				require.NoError(t, err)
				require.NoError(t, req.Wait())
				req.Release()
				for i, p := range pieces {
					gs[i].Check(t, want[p.Tensor][p.Offset:p.End()], c.name)
				}
			}
			if c.inline {
				pm := arenaOf(t, meta)
				pm.takePieces(pieces)
				kept, err := dst.peers.record(transport.PeerInfo{RuntimeID: sourceRuntime})
				require.NoError(t, err)
				_, x := transporttest.Buffer(t, 16)
				a, err := dst.rcv.getSegment(nil, kept, os.Getpid(), pm, []transport.Tensor{x}, false)
				require.NoError(t, err)
				assert.GreaterOrEqual(t, a.fd, 0, "a partial fetch takes the descriptor, not the whole object inline")
				unix.Close(a.fd)
			}
			// The whole object still comes whole after partial fetches.
			got, err := fetch(t, dst, meta, c.sizes...)
			require.NoError(t, err)
			sameBytes(t, want, got)
		})
	}
}

// Pieces outside what the decoded metadata describes are refused before
// anything is asked or written, whatever the ref said: a tensor it lacks,
// bytes past a tensor's end, a length that wraps.
func TestPartialFetchOutsideTheMetadataIsRefused(t *testing.T) {
	src, dst := newSegmentTransport(t), newTransport(t)
	meta, _ := stageObject(t, src, 2, 4096, 100)
	for _, p := range []transport.Piece{
		{Tensor: 2, Offset: 0, Length: 16},
		{Tensor: 1, Offset: 90, Length: 16},
		{Tensor: 0, Offset: 8, Length: ^uint64(0) - 4},
	} {
		g := transporttest.GuardedTarget(t, 16)
		x := transferOf(t, meta)
		x.Pieces = []transport.Piece{p}
		_, err := dst.Fetch(x, []transport.Tensor{g.Target}, meta, nil)
		assert.Equal(t, transport.ErrInvalidArgument, transport.StatusOf(err), "%+v: %v", p, err)
		g.Check(t, nil, fmt.Sprintf("%+v: nothing written", p))
	}
	assert.Zero(t, dst.peers.count(), "nothing was asked of the source")
}
