package engine

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rdt-project/rdt/core/control"
	"github.com/rdt-project/rdt/core/transport"
)

// The pieces an admitted write may touch reach the servers that land its
// bytes merged: a frame inside ranges the writer named overlapping (a
// piece that starts in one and ends in another) is inside, and no pieces
// stay no bytes rather than becoming every tensor.
func TestAdmittedPiecesAreMergedForTheServers(t *testing.T) {
	p := writablePair(t)
	owned, _, _ := p.expose(t)
	id := owned.Desc().ID
	writer := transport.PeerInfo{RuntimeID: transport.RandomID()}
	open := func(transfer uint64, pieces []transport.Piece) []transport.Piece {
		require.NoError(t, openErr(p.owner.OpenWrite(writer, control.WriteOpen{Object: id, TransferID: transfer, Transport: "mem", Key: owned.Desc().WriteKey, Pieces: pieces})))
		_, got, done, err := p.owner.WriteInto(id, transfer)
		require.NoError(t, err)
		done()
		return got
	}
	got := open(1, []transport.Piece{{Tensor: 1, Offset: 40, Length: 30}, {Tensor: 0, Offset: 64, Length: 64}, {Tensor: 1, Offset: 0, Length: 60}, {Tensor: 1, Offset: 70, Length: 10}})
	assert.Equal(t, []transport.Piece{{Tensor: 0, Offset: 64, Length: 64}, {Tensor: 1, Offset: 0, Length: 80}}, got)
	assert.True(t, transport.Covered(got, transport.Piece{Tensor: 1, Offset: 50, Length: 30}), "a frame across the joined ranges")
	assert.False(t, transport.Covered(got, transport.Piece{Tensor: 1, Offset: 50, Length: 31}))

	none := open(2, []transport.Piece{})
	assert.NotNil(t, none, "no pieces are no bytes, not every tensor")
	assert.False(t, transport.Covered(none, transport.Piece{Tensor: 0, Length: 1}))
}

// Pieces may name the same bytes again and again, so their total is not
// bounded by the object: one past 2^64 is refused, not wrapped into the
// small number a notice would report.
func TestPiecesWhoseTotalWrapsAreRefused(t *testing.T) {
	huge := []transport.Tensor{{TensorDesc: transport.TensorDesc{Nbytes: 1 << 63}}}
	whole := transport.Piece{Length: 1 << 63}
	total, err := checkPieces(huge, []transport.Piece{whole, {Length: 1 << 62}})
	require.NoError(t, err)
	assert.Equal(t, uint64(1<<63+1<<62), total)
	_, err = checkPieces(huge, []transport.Piece{whole, whole})
	assert.Equal(t, transport.ErrInvalidArgument, transport.StatusOf(err), "%v", err)
	_, err = checkPieces(huge, []transport.Piece{whole, {Offset: 1 << 62, Length: 1 << 62}, {Length: 1 << 62}})
	assert.Equal(t, transport.ErrInvalidArgument, transport.StatusOf(err), "%v", err)
}
