package transport

import (
	"encoding/binary"
	"math"
	"math/bits"
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

// ends is where p ends in 65-bit arithmetic, the reference the fuzz
// targets compare with: its end and whether that passes 2^64.
func ends(p Piece) (uint64, bool) {
	end, carry := bits.Add64(p.Offset, p.Length, 0)
	return end, carry != 0
}

// clippedEnd is p's end, or 2^64-1 when it would pass it.
func clippedEnd(p Piece) uint64 {
	if end, past := ends(p); !past {
		return end
	}
	return math.MaxUint64
}

// FuzzPieceContains checks Contains, Within and End against 65-bit
// arithmetic: a range is inside another exactly when it starts at or
// after it and ends at or before its (clipped) end, and nothing wraps.
func FuzzPieceContains(f *testing.F) {
	f.Add(uint64(0), uint64(16), uint64(4096), uint64(16), false, uint64(1<<17))
	f.Add(uint64(0), uint64(16), uint64(65536), uint64(65536), false, uint64(1<<17))
	f.Add(uint64(8), uint64(8), uint64(8), uint64(8), false, uint64(16))
	f.Add(uint64(math.MaxUint64-4), uint64(100), uint64(math.MaxUint64-2), uint64(100), false, uint64(math.MaxUint64))
	f.Add(uint64(0), uint64(math.MaxUint64), uint64(8), uint64(math.MaxUint64-4), true, uint64(100))
	f.Fuzz(func(t *testing.T, pOff, pLen, qOff, qLen uint64, otherTensor bool, n uint64) {
		p, q := Piece{Tensor: 3, Offset: pOff, Length: pLen}, Piece{Tensor: 3, Offset: qOff, Length: qLen}
		if otherTensor {
			q.Tensor = 4
		}
		qEnd, qPast := ends(q)
		want := !otherTensor && qOff >= pOff && !qPast && qEnd <= clippedEnd(p)
		if got := p.Contains(q); got != want {
			t.Fatalf("%+v.Contains(%+v) = %v, want %v", p, q, got, want)
		}
		if got := p.End(); got != clippedEnd(p) {
			t.Fatalf("%+v.End() = %d", p, got)
		}
		pEnd, pPast := ends(p)
		if got, want := p.Within(n), !pPast && pEnd <= n; got != want {
			t.Fatalf("%+v.Within(%d) = %v, want %v", p, n, got, want)
		}
	})
}

// piecesFrom reads pieces from b, 17 bytes each: a tensor (of three),
// an offset and a length, at most max of them.
func piecesFrom(b []byte, max int) []Piece {
	var out []Piece
	for ; len(b) >= 17 && len(out) < max; b = b[17:] {
		out = append(out, Piece{Tensor: uint32(b[0] % 3), Offset: binary.LittleEndian.Uint64(b[1:]), Length: binary.LittleEndian.Uint64(b[9:])})
	}
	return out
}

// sweepCovers is the reference for Covered: walking q's bytes from its
// start, some piece always holds the next one (pieces clipped at 2^64-1,
// as End clips them).
func sweepCovers(pieces []Piece, q Piece) bool {
	end, past := ends(q)
	if past {
		return false
	}
	for at := q.Offset; at < end; {
		next := at
		for _, p := range pieces {
			if p.Tensor == q.Tensor && p.Offset <= at && at < clippedEnd(p) {
				next = max(next, clippedEnd(p))
			}
		}
		if next == at {
			return false
		}
		at = next
	}
	return true
}

// FuzzCovered checks MergePieces and Covered for any pieces a peer names:
// merged pieces are sorted, neither overlap nor touch, do not wrap and
// name the same bytes (nil and none kept apart), and a non-empty range is
// covered exactly when every byte of it lies in some piece.
func FuzzCovered(f *testing.F) {
	add := func(q Piece, pieces ...Piece) {
		b := []byte{1}
		for _, p := range pieces {
			b = append(b, byte(p.Tensor))
			b = binary.LittleEndian.AppendUint64(b, p.Offset)
			b = binary.LittleEndian.AppendUint64(b, p.Length)
		}
		f.Add(b, uint8(q.Tensor), q.Offset, q.Length)
	}
	add(Piece{Offset: 4096, Length: 16}, Piece{Length: 16})
	add(Piece{Offset: 65536, Length: 65536}, Piece{Length: 16})
	add(Piece{Offset: 8 << 20, Length: 4 << 20}, Piece{Length: 12 << 20}, Piece{Offset: 4 << 20, Length: 5 << 20})
	add(Piece{Offset: 50, Length: 30}, Piece{Offset: 40, Length: 30}, Piece{Offset: 70, Length: 10})
	add(Piece{Offset: math.MaxUint64 - 3, Length: 3}, Piece{Offset: math.MaxUint64 - 8, Length: 100})
	f.Fuzz(func(t *testing.T, raw []byte, qTensor uint8, qOff, qLen uint64) {
		var pieces []Piece
		if len(raw) > 0 { // no bytes: nil, every byte
			pieces = append([]Piece{}, piecesFrom(raw[1:], 64)...)
		}
		merged := MergePieces(pieces)
		if (merged == nil) != (pieces == nil) {
			t.Fatalf("MergePieces(%v) = %v: nil and no pieces mixed up", pieces, merged)
		}
		for i, m := range merged {
			if _, past := ends(m); past {
				t.Fatalf("merged piece %+v wraps", m)
			}
			if i > 0 {
				if prev := merged[i-1]; prev.Tensor > m.Tensor || (prev.Tensor == m.Tensor && prev.End() >= m.Offset) {
					t.Fatalf("merged pieces %+v and %+v are out of order, overlap or touch", prev, m)
				}
			}
			if m.Length > 0 && !sweepCovers(pieces, m) {
				t.Fatalf("merged piece %+v names bytes no piece of %v does", m, pieces)
			}
		}
		for _, p := range pieces {
			if clipped := (Piece{Tensor: p.Tensor, Offset: p.Offset, Length: p.End() - p.Offset}); !Covered(merged, clipped) {
				t.Fatalf("piece %+v is not covered by the merged %v", clipped, merged)
			}
		}
		q := Piece{Tensor: uint32(qTensor % 3), Offset: qOff, Length: qLen}
		if pieces == nil {
			if !Covered(merged, q) {
				t.Fatalf("nil pieces refused %+v", q)
			}
			return
		}
		if got := Covered(merged, q); q.Length > 0 && got != sweepCovers(pieces, q) {
			t.Fatalf("Covered(%v, %+v) = %v for pieces %v", merged, q, got, pieces)
		}
	})
}

// FuzzCheckPieces checks a partial transfer's pieces against a source's
// description as a transport's metadata gives it (tensor sizes a peer
// sent): accepted exactly when every piece names a tensor there, lies
// inside it in 65-bit arithmetic and is as long as its target.
func FuzzCheckPieces(f *testing.F) {
	f.Add([]byte{}, []byte{})
	f.Add(binary.LittleEndian.AppendUint64(nil, 1000), append([]byte{0}, make([]byte, 16)...))
	f.Fuzz(func(t *testing.T, rawSizes, rawPieces []byte) {
		var sizes []uint64
		for ; len(rawSizes) >= 8 && len(sizes) < 3; rawSizes = rawSizes[8:] {
			sizes = append(sizes, binary.LittleEndian.Uint64(rawSizes))
		}
		pieces := piecesFrom(rawPieces, 16)
		x := &Transfer{Pieces: pieces}
		targets := make([]Tensor, len(pieces))
		want := pieces != nil
		for i, p := range pieces {
			targets[i].Nbytes = p.Length
			if i%2 == 1 {
				targets[i].Nbytes ^= uint64(rawPieces[0]) & 1 // now and then a target of another size
			}
			end, past := ends(p)
			want = want && int(p.Tensor) < len(sizes) && !past && end <= sizes[p.Tensor] && targets[i].Nbytes == p.Length
		}
		err := x.CheckPieces(targets, len(sizes), func(i int) uint64 { return sizes[i] })
		if pieces == nil {
			return // a whole transfer: no pieces to check
		}
		if (err == nil) != want {
			t.Fatalf("CheckPieces(%v, sizes %v) = %v, want ok %v", pieces, sizes, err, want)
		}
		if err != nil && StatusOf(err) != ErrInvalidArgument {
			t.Fatalf("status %v: %v", StatusOf(err), err)
		}
	})
}
