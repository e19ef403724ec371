package transport

// Piece is the part of a source tensor that one target of a partial fetch
// receives: Length bytes from byte Offset of tensor Tensor of the object.
type Piece struct {
	Tensor uint32
	Offset uint64
	Length uint64
}

// End is the byte after the piece. Pieces are checked (CheckPieces) before
// a transport sees them, so it cannot overflow there.
func (p Piece) End() uint64 { return p.Offset + p.Length }

// Within reports whether the piece lies inside a tensor of n bytes.
func (p Piece) Within(n uint64) bool { return p.Offset <= n && p.Length <= n-p.Offset }

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
