package nixl

import (
	"testing"

	"github.com/rdt-project/rdt/core/transport"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// plan only computes addresses: these tests place the source's tensors and
// the targets at made-up addresses, never read.

const (
	remoteBase = 0x7f00_0000_0000 // the source's buffer
	localBase  = 0x7e00_0000_0000 // the destination's buffer
)

// at is a host tensor of n bytes at addr.
func at(t *testing.T, addr uint64, n int) transport.Tensor {
	t.Helper()
	desc, err := transport.NewTensorDesc(transport.Device{Type: transport.DeviceCPU}, transport.DType{Code: 1, Bits: 8, Lanes: 1}, []int64{int64(n)})
	require.NoError(t, err)
	return transport.Tensor{TensorDesc: desc, Data: uintptr(addr), Orig: uintptr(addr)}
}

// views is metadata of count tensors of size bytes, back to back in one
// source buffer.
func views(version uint8, count int, size uint64) *metadata {
	m := &metadata{Version: version}
	for i := 0; i < count; i++ {
		m.Regions = append(m.Regions, region{Addr: remoteBase + uint64(i)*size, Size: size, Mem: memDRAM})
	}
	return m
}

// planPieces plans pieces of m into targets at the given local offsets and
// returns the descriptors of the one chunk it makes.
func planPieces(t *testing.T, m *metadata, pieces []transport.Piece, localOffsets []uint64) []span {
	t.Helper()
	var targets []transport.Tensor
	for i, p := range pieces {
		targets = append(targets, at(t, localBase+localOffsets[i], int(p.Length)))
	}
	x := &transport.Transfer{Pieces: pieces}
	require.NoError(t, x.CheckPieces(targets, len(m.Regions), func(i int) uint64 { return m.Regions[i].Size }))
	chunks, _, _, err := plan(x, m, targets)
	require.NoError(t, err)
	require.Len(t, chunks, 1)
	return chunks[0].spans
}

// Pieces that touch on both sides are read with one descriptor, whether
// they come from one tensor or run from one tensor into the next; a gap on
// either side, or an order the source does not have, keeps them apart.
func TestPlanMergesPiecesThatTouchOnBothSides(t *testing.T) {
	m := views(metaVersion, 3, 4096)
	for _, c := range []struct {
		what   string
		pieces []transport.Piece
		local  []uint64 // each target's offset in the local buffer
		want   []span
	}{
		{
			what:   "the end of one tensor and the start of the next, into touching targets",
			pieces: []transport.Piece{{Tensor: 0, Offset: 2048, Length: 2048}, {Tensor: 1, Offset: 0, Length: 1024}},
			local:  []uint64{0, 2048},
			want:   []span{{laddr: localBase, raddr: remoteBase + 2048, n: 3072}},
		},
		{
			what:   "two touching ranges of one tensor, an empty piece between them",
			pieces: []transport.Piece{{Tensor: 1, Offset: 0, Length: 100}, {Tensor: 2, Offset: 7, Length: 0}, {Tensor: 1, Offset: 100, Length: 300}},
			local:  []uint64{500, 0, 600},
			want:   []span{{laddr: localBase + 500, raddr: remoteBase + 4096, n: 400}},
		},
		{
			what:   "a gap at the source",
			pieces: []transport.Piece{{Tensor: 0, Offset: 0, Length: 1024}, {Tensor: 0, Offset: 2048, Length: 1024}},
			local:  []uint64{0, 1024},
			want: []span{
				{laddr: localBase, raddr: remoteBase, n: 1024},
				{laddr: localBase + 1024, raddr: remoteBase + 2048, n: 1024},
			},
		},
		{
			what:   "a gap between the targets",
			pieces: []transport.Piece{{Tensor: 0, Offset: 0, Length: 4096}, {Tensor: 1, Offset: 0, Length: 4096}},
			local:  []uint64{0, 8192},
			want: []span{
				{laddr: localBase, raddr: remoteBase, n: 4096},
				{laddr: localBase + 8192, raddr: remoteBase + 4096, n: 4096},
			},
		},
		{
			what:   "touching tensors in the other order",
			pieces: []transport.Piece{{Tensor: 1, Offset: 0, Length: 4096}, {Tensor: 0, Offset: 0, Length: 4096}},
			local:  []uint64{0, 4096},
			want: []span{
				{laddr: localBase, raddr: remoteBase + 4096, n: 4096},
				{laddr: localBase + 4096, raddr: remoteBase, n: 4096},
			},
		},
		{
			what:   "the same bytes twice",
			pieces: []transport.Piece{{Tensor: 2, Offset: 0, Length: 16}, {Tensor: 2, Offset: 0, Length: 16}},
			local:  []uint64{0, 16},
			want: []span{
				{laddr: localBase, raddr: remoteBase + 8192, n: 16},
				{laddr: localBase + 16, raddr: remoteBase + 8192, n: 16},
			},
		},
	} {
		assert.Equal(t, c.want, planPieces(t, m, c.pieces, c.local), c.what)
	}
}

// A version-1 source registered each tensor alone: ranges of one tensor
// still merge, a run into the next tensor does not.
func TestPlanMergesAcrossTensorsOnlyWhenTheSourcePromises(t *testing.T) {
	m := views(1, 2, 4096)
	across := []transport.Piece{{Tensor: 0, Offset: 2048, Length: 2048}, {Tensor: 1, Offset: 0, Length: 1024}}
	assert.Len(t, planPieces(t, m, across, []uint64{0, 2048}), 2)
	within := []transport.Piece{{Tensor: 1, Offset: 0, Length: 1024}, {Tensor: 1, Offset: 1024, Length: 1024}}
	assert.Equal(t, []span{{laddr: localBase, raddr: remoteBase + 4096, n: 2048}}, planPieces(t, m, within, []uint64{0, 1024}))
}

// A whole fetch of many small tensors that are views of one buffer, into
// views of one buffer, is one descriptor and one local registration.
func TestPlanCollapsesAWholeFetchOfViews(t *testing.T) {
	const count, size = 64, 256
	m := views(metaVersion, count, size)
	var targets []transport.Tensor
	for i := 0; i < count; i++ {
		targets = append(targets, at(t, localBase+uint64(i*size), size))
	}
	chunks, local, total, err := plan(&transport.Transfer{}, m, targets)
	require.NoError(t, err)
	require.Len(t, chunks, 1)
	assert.Equal(t, []span{{laddr: localBase, raddr: remoteBase, n: count * size}}, chunks[0].spans)
	assert.Equal(t, []regKey{{mem: memDRAM, addr: localBase, size: count * size}}, local)
	assert.Equal(t, uint64(count*size), total)
}

// Merging stops at a chunk's bound: touching pieces larger than a chunk
// together are read by one request each.
func TestPlanMergesWithinAChunk(t *testing.T) {
	m := views(metaVersion, 2, chunkSize)
	pieces := []transport.Piece{{Tensor: 0, Offset: chunkSize / 2, Length: chunkSize / 2}, {Tensor: 1, Offset: 0, Length: chunkSize/2 + 1}}
	x := &transport.Transfer{Pieces: pieces}
	targets := []transport.Tensor{at(t, localBase, chunkSize/2), at(t, localBase+chunkSize/2, chunkSize/2+1)}
	chunks, local, _, err := plan(x, m, targets)
	require.NoError(t, err)
	require.Len(t, chunks, 2)
	assert.Len(t, chunks[0].spans, 1)
	assert.Len(t, chunks[1].spans, 1)
	assert.Len(t, local, 1, "the targets touch: one registration")
}
