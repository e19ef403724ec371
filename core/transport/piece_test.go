package transport

import (
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
)

// Containment is decided without a sum or difference that wraps: bytes
// past the end of a piece, however far, are outside it.
func TestContainsNeverWraps(t *testing.T) {
	first := Piece{Length: 16}
	for _, c := range []struct {
		p, q Piece
		in   bool
	}{
		{first, Piece{Length: 16}, true},
		{first, Piece{Offset: 8, Length: 8}, true},
		{first, Piece{Offset: 16}, true}, // empty, at its end
		{first, Piece{Offset: 8, Length: 9}, false},
		{first, Piece{Offset: 17}, false},
		{first, Piece{Offset: 4096, Length: 16}, false},
		{first, Piece{Offset: 8192, Length: 16}, false},
		{first, Piece{Offset: 65536, Length: 64 << 10}, false},
		{first, Piece{Offset: math.MaxUint64, Length: 1}, false},
		{first, Piece{Offset: 8, Length: math.MaxUint64}, false},
		{first, Piece{Tensor: 1, Length: 16}, false},
		{Piece{Offset: 100, Length: 16}, Piece{Offset: 99, Length: 1}, false},
		{Piece{Offset: 1 << 63, Length: 1 << 63}, Piece{Offset: math.MaxUint64 - 1, Length: 1}, true},
		// A piece whose end does not fit (never a checked one) ends at
		// the last offset there is.
		{Piece{Offset: math.MaxUint64 - 4, Length: 100}, Piece{Offset: math.MaxUint64 - 4, Length: 4}, true},
		{Piece{Offset: math.MaxUint64 - 4, Length: 100}, Piece{Offset: math.MaxUint64 - 4, Length: 5}, false},
		{Piece{Offset: math.MaxUint64 - 4, Length: 100}, Piece{Offset: math.MaxUint64 - 2, Length: 100}, false},
	} {
		assert.Equal(t, c.in, c.p.Contains(c.q), "%+v in %+v", c.q, c.p)
	}
	assert.Equal(t, uint64(math.MaxUint64), Piece{Offset: math.MaxUint64 - 1, Length: 5}.End(), "End does not wrap")
	assert.True(t, Piece{Offset: 10, Length: 90}.Within(100))
	assert.False(t, Piece{Offset: 10, Length: 91}.Within(100))
	assert.False(t, Piece{Offset: 101}.Within(100))
	assert.False(t, Piece{Offset: 8, Length: math.MaxUint64 - 4}.Within(100))
}

// Merged pieces are sorted, joined where they overlap or touch, and name
// the same bytes; nil (every byte) and none (no byte) stay apart.
func TestMergePieces(t *testing.T) {
	assert.Nil(t, MergePieces(nil))
	none := MergePieces([]Piece{})
	assert.NotNil(t, none)
	assert.Empty(t, none)
	assert.False(t, Covered(none, Piece{Length: 1}), "a write admitted for no bytes lands none")

	got := MergePieces([]Piece{
		{Tensor: 1, Offset: 50, Length: 10},
		{Tensor: 0, Offset: 0, Length: 100},
		{Tensor: 0, Offset: 10, Length: 10}, // inside the first
		{Tensor: 1, Offset: 60, Length: 5},  // touches the one before
		{Tensor: 0, Offset: 200, Length: 0}, // empty, apart
		{Tensor: 1, Offset: 40, Length: 15}, // overlaps
		{Tensor: 0, Offset: 90, Length: 20}, // past the first's end
		{Tensor: 2, Offset: math.MaxUint64 - 2, Length: 9},
	})
	assert.Equal(t, []Piece{
		{Tensor: 0, Offset: 0, Length: 110},
		{Tensor: 0, Offset: 200, Length: 0},
		{Tensor: 1, Offset: 40, Length: 25},
		{Tensor: 2, Offset: math.MaxUint64 - 2, Length: 2},
	}, got)
}

// Covered finds the one piece that can hold a range and checks it: a
// range straddling two pieces that do not touch, or past the last, is
// outside, and one inside pieces that were joined is inside.
func TestCovered(t *testing.T) {
	admitted := MergePieces([]Piece{{Offset: 0, Length: 16}, {Offset: 100, Length: 50}, {Offset: 120, Length: 100}, {Tensor: 1, Offset: 8, Length: 8}})
	for _, c := range []struct {
		q  Piece
		in bool
	}{
		{Piece{Length: 16}, true},
		{Piece{Offset: 4096, Length: 16}, false},
		{Piece{Offset: 8, Length: 100}, false},
		{Piece{Offset: 140, Length: 80}, true},
		{Piece{Offset: 140, Length: 81}, false},
		{Piece{Offset: 99, Length: 2}, false},
		{Piece{Tensor: 1, Offset: 8, Length: 8}, true},
		{Piece{Tensor: 1, Offset: 0, Length: 8}, false},
		{Piece{Tensor: 2}, false},
	} {
		assert.Equal(t, c.in, Covered(admitted, c.q), "%+v", c.q)
	}
	assert.True(t, Covered(nil, Piece{Offset: math.MaxUint64, Length: 7}), "nil admits every byte; the caller checks the tensor")
}
