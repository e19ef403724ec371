package transport

import (
	"cmp"
	"math"
	"slices"
	"sort"
)

// Piece is the part of a source tensor that one target of a partial fetch
// receives: Length bytes from byte Offset of tensor Tensor of the object.
// A peer's numbers reach pieces unchecked: every comparison of ranges goes
// through Contains (Within, Covered), written so that no sum or difference
// wraps, whatever the numbers.
type Piece struct {
	Tensor uint32
	Offset uint64
	Length uint64
}

// End is the byte after the piece. A piece whose end does not fit in 64
// bits (never a checked one) ends at the last offset there is: End does
// not wrap.
func (p Piece) End() uint64 { return p.Offset + min(p.Length, math.MaxUint64-p.Offset) }

// Contains reports whether every byte of q is one of p's: the same tensor,
// q starting at or after p and ending at or before p's End. An empty q
// lies inside p when it starts within p or at its end.
func (p Piece) Contains(q Piece) bool {
	if q.Tensor != p.Tensor || q.Offset < p.Offset {
		return false
	}
	room, into := p.End()-p.Offset, q.Offset-p.Offset // neither wraps: End >= Offset, q.Offset >= p.Offset
	return into <= room && q.Length <= room-into
}

// Within reports whether the piece lies inside a tensor of n bytes.
func (p Piece) Within(n uint64) bool { return Piece{Tensor: p.Tensor, Length: n}.Contains(p) }

// MergePieces is pieces sorted by tensor and offset, those that overlap or
// touch joined into one, and each cut at End: the same bytes, listed the
// way Covered searches them. Nil stays nil (every tensor, whole), and no
// pieces stay no pieces (no byte): the two must not be confused.
func MergePieces(pieces []Piece) []Piece {
	if pieces == nil {
		return nil
	}
	sorted := slices.Clone(pieces)
	slices.SortFunc(sorted, func(a, b Piece) int {
		if a.Tensor != b.Tensor {
			return cmp.Compare(a.Tensor, b.Tensor)
		}
		return cmp.Compare(a.Offset, b.Offset)
	})
	out := make([]Piece, 0, len(sorted))
	for _, p := range sorted {
		if n := len(out); n > 0 && out[n-1].Tensor == p.Tensor && p.Offset <= out[n-1].End() {
			last := &out[n-1]
			last.Length = max(last.End(), p.End()) - last.Offset
			continue
		}
		p.Length = p.End() - p.Offset
		out = append(out, p)
	}
	return out
}

// Covered reports whether every byte of q lies inside the admitted pieces
// (as MergePieces lists them; nil admits every byte, and the caller checks
// q against its tensor). Pieces listed otherwise may make it refuse bytes
// they admit, never accept bytes they do not.
func Covered(admitted []Piece, q Piece) bool {
	if admitted == nil {
		return true
	}
	// The last admitted piece starting at or before q: the only one that
	// can hold q's first byte when none overlaps or touches another.
	i := sort.Search(len(admitted), func(i int) bool {
		a := admitted[i]
		return a.Tensor > q.Tensor || (a.Tensor == q.Tensor && a.Offset > q.Offset)
	}) - 1
	return i >= 0 && admitted[i].Contains(q)
}

// PieceOf is what target i of x receives: x.Pieces[i] in a partial fetch,
// else tensor i whole.
func (x *Transfer) PieceOf(i int, target Tensor) Piece {
	if x.Pieces != nil {
		return x.Pieces[i]
	}
	return Piece{Tensor: uint32(i), Length: target.Nbytes}
}

// CheckPieces checks the targets of x against the source's tensors as a
// transport's metadata describes them (count tensors, tensor i being
// size(i) bytes): in a whole fetch one target per tensor, each of the
// tensor's size; in a partial one each piece inside its tensor and as long
// as its target. Transports call it on the metadata they decoded, which may
// describe less than the ref did.
func (x *Transfer) CheckPieces(targets []Tensor, count int, size func(int) uint64) error {
	if x.Pieces == nil {
		if count != len(targets) {
			return Errorf(ErrInvalidArgument, "the source describes %d tensors, %d targets given", count, len(targets))
		}
		for i, t := range targets {
			if n := size(i); n != t.Nbytes {
				return Errorf(ErrInvalidArgument, "tensor %d is %d bytes at the source, the target holds %d", i, n, t.Nbytes)
			}
		}
		return nil
	}
	if len(x.Pieces) != len(targets) {
		return Errorf(ErrInvalidArgument, "%d pieces for %d targets", len(x.Pieces), len(targets))
	}
	for i, p := range x.Pieces {
		if int64(p.Tensor) >= int64(count) {
			return Errorf(ErrInvalidArgument, "target %d asks for tensor %d; the source describes %d", i, p.Tensor, count)
		}
		if n := size(int(p.Tensor)); !p.Within(n) {
			return Errorf(ErrInvalidArgument, "target %d asks for bytes [%d, +%d) of tensor %d, which is %d bytes at the source", i, p.Offset, p.Length, p.Tensor, n)
		}
		if p.Length != targets[i].Nbytes {
			return Errorf(ErrInvalidArgument, "target %d holds %d bytes for a piece of %d", i, targets[i].Nbytes, p.Length)
		}
	}
	return nil
}
