package transporttest

import (
	"bytes"
	"fmt"
	"math/rand"

	"github.com/rdt-project/rdt/core/transport"
)

// AdmittedMask is the tests' reference for what a write may touch, kept
// apart from the arithmetic under test: byte b of tensor i is admitted
// when mask[i][b] is set. Transports' property and fuzz tests compare
// their landing code with it.
type AdmittedMask [][]bool

// NewAdmittedMask marks the bytes of tensors of the given sizes that the
// admitted pieces name (nil: every byte), byte by byte. Bytes a piece
// names past its tensor are not marked: they do not exist.
func NewAdmittedMask(sizes []int, admitted []transport.Piece) AdmittedMask {
	m := make(AdmittedMask, len(sizes))
	for i, n := range sizes {
		m[i] = make([]bool, n)
		if admitted == nil {
			for b := range m[i] {
				m[i][b] = true
			}
		}
	}
	for _, p := range admitted {
		if int(p.Tensor) >= len(m) {
			continue
		}
		marks := m[p.Tensor]
		for b, k := p.Offset, uint64(0); b < uint64(len(marks)) && k < p.Length; b, k = b+1, k+1 {
			marks[b] = true
		}
	}
	return m
}

// Admits reports whether q names bytes of its tensor only, each of them
// admitted.
func (m AdmittedMask) Admits(q transport.Piece) bool {
	if int(q.Tensor) >= len(m) {
		return false
	}
	marks := m[q.Tensor]
	for b, k := q.Offset, uint64(0); k < q.Length; b, k = b+1, k+1 {
		if b >= uint64(len(marks)) || !marks[b] {
			return false
		}
	}
	return true
}

// Untouched says which byte outside the admitted ones differs between
// before and after (the tensors' contents), or nil when none does.
func (m AdmittedMask) Untouched(before, after [][]byte) error {
	for i, marks := range m {
		for b, ok := range marks {
			if !ok && before[i][b] != after[i][b] {
				return fmt.Errorf("byte %d of tensor %d, which no admitted piece names, changed from %#x to %#x", b, i, before[i][b], after[i][b])
			}
		}
	}
	return nil
}

// RandomAdmitted is what a write into tensors of the given sizes may be
// admitted for: nil (every byte) now and then, else up to four pieces
// inside the tensors, in any order, overlapping or not.
func RandomAdmitted(rng *rand.Rand, sizes []int) []transport.Piece {
	if rng.Intn(10) == 0 {
		return nil
	}
	pieces := []transport.Piece{}
	for range rng.Intn(5) {
		i := rng.Intn(len(sizes))
		off := rng.Intn(sizes[i] + 1)
		pieces = append(pieces, transport.Piece{Tensor: uint32(i), Offset: uint64(off), Length: uint64(rng.Intn(sizes[i] - off + 1))})
	}
	return pieces
}

// RandomRange is a range a hostile writer might address for a write
// admitted for admitted: inside a piece, from inside one past its end,
// past one, ending where one starts, anywhere in or past a tensor, or at
// an offset near 2^64.
func RandomRange(rng *rand.Rand, sizes []int, admitted []transport.Piece) transport.Piece {
	i := rng.Intn(len(sizes))
	q := transport.Piece{Tensor: uint32(i), Offset: uint64(rng.Intn(sizes[i] + 64)), Length: uint64(rng.Intn(sizes[i]/2 + 32))}
	if len(admitted) > 0 && rng.Intn(3) > 0 {
		a := admitted[rng.Intn(len(admitted))]
		q.Tensor = a.Tensor
		switch rng.Intn(4) {
		case 0: // inside it
			q.Offset = a.Offset + uint64(rng.Int63n(int64(a.Length)+1))
			q.Length = uint64(rng.Int63n(int64(a.End()-q.Offset) + 1))
		case 1: // from inside it, past its end
			q.Offset = a.Offset + uint64(rng.Int63n(int64(a.Length)+1))
			q.Length = a.End() - q.Offset + 1 + uint64(rng.Intn(64))
		case 2: // starting past its end
			q.Offset = a.End() + 1 + uint64(rng.Intn(8192))
		case 3: // ending where it starts
			q.Offset = a.Offset - min(a.Offset, uint64(rng.Intn(64)))
			q.Length = a.Offset - q.Offset
		}
	}
	if rng.Intn(20) == 0 {
		q.Offset = ^uint64(0) - uint64(rng.Intn(int(q.Length)+2))
	}
	return q
}

// CloneAll copies the contents of tensors.
func CloneAll(b [][]byte) [][]byte {
	out := make([][]byte, len(b))
	for i := range b {
		out[i] = bytes.Clone(b[i])
	}
	return out
}
