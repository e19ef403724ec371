package engine

import (
	"encoding/binary"
	"math/bits"
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
		require.NoError(t, openErr(p.owner.svc.OpenWrite(writer, control.WriteOpen{Object: id, TransferID: transfer, Transport: "mem", Key: owned.Desc().WriteKey, Pieces: pieces})))
		_, got, done, err := p.owner.host.WriteInto(id, transfer)
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

// FuzzCheckSource checks a partial fetch's (or write's) source against
// the owner's description of its tensor, as a ref a peer made describes
// it (shapes and dtypes checked on decoding, so that sizes are whole
// elements): accepted exactly when the range, RestOfTensor resolved, lies
// inside the tensor in 65-bit arithmetic, falls on its elements (or is
// the whole tensor, for elements smaller than a byte) and is as long as
// the target.
func FuzzCheckSource(f *testing.F) {
	f.Add(uint32(0), uint64(4096), uint64(16), int64(128<<10), uint8(8), uint16(1), uint64(16))
	f.Add(uint32(0), uint64(8), RestOfTensor, int64(25), uint8(32), uint16(1), uint64(92))
	f.Add(uint32(0), uint64(1), ^uint64(0)-4, int64(100), uint8(8), uint16(1), uint64(0))
	f.Add(uint32(1), uint64(0), uint64(0), int64(0), uint8(4), uint16(2), uint64(0))
	f.Add(uint32(0), uint64(0), uint64(2), int64(3), uint8(4), uint16(1), uint64(2))
	f.Add(uint32(2), uint64(0), uint64(1), int64(1), uint8(8), uint16(1), uint64(1))
	f.Fuzz(func(t *testing.T, tensor uint32, off, length uint64, elems int64, dtBits uint8, lanes uint16, targetBytes uint64) {
		dt := transport.DType{Code: 1, Bits: dtBits, Lanes: lanes}
		cpu := transport.Device{Type: transport.DeviceCPU}
		whole, err := transport.NewTensorDesc(cpu, dt, []int64{elems})
		if err != nil {
			return // no ref describes it
		}
		half, err := transport.NewTensorDesc(cpu, dt, []int64{elems / 2})
		require.NoError(t, err)
		desc := &ObjectDesc{Tensors: []transport.TensorDesc{whole, half}}
		target := transport.Tensor{TensorDesc: transport.TensorDesc{Device: cpu, DType: dt, Nbytes: targetBytes}}
		p, err := checkSource(desc, Range{Piece: transport.Piece{Tensor: tensor, Offset: off, Length: length}}, target)

		want := int(tensor) < len(desc.Tensors) // the reference, in 65-bit arithmetic
		if want {
			n := desc.Tensors[tensor].Nbytes
			if length == RestOfTensor && off <= n {
				length = n - off
			}
			end, carry := bits.Add64(off, length, 0)
			aligned := off == 0 && length == n
			if bitsPer := uint64(dtBits) * uint64(lanes); bitsPer%8 == 0 {
				aligned = off%(bitsPer/8) == 0 && length%(bitsPer/8) == 0
			}
			want = carry == 0 && end <= n && aligned && targetBytes == length
		}
		if (err == nil) != want {
			t.Fatalf("checkSource(tensor %d, [%d, +%d)) of tensors %v into %d bytes: %v, want ok %v", tensor, off, length, desc.Tensors, targetBytes, err, want)
		}
		if err == nil && (p.Offset != off || p.Length != length || p.Tensor != tensor) {
			t.Fatalf("checked piece %+v, want [%d, +%d) of tensor %d", p, off, length, tensor)
		}
	})
}

// FuzzCheckAdmittedPieces checks the pieces a peer asks to write (or to
// be sent) against the object's tensors: accepted exactly when each names
// a tensor and lies inside it in 65-bit arithmetic and their total fits
// in 64 bits, which is then the total returned.
func FuzzCheckAdmittedPieces(f *testing.F) {
	piece := func(tensor byte, off, length uint64) []byte {
		return binary.LittleEndian.AppendUint64(binary.LittleEndian.AppendUint64([]byte{tensor}, off), length)
	}
	f.Add(uint64(128<<10), append(piece(0, 0, 16), piece(0, 65536, 65536)...))
	f.Add(uint64(1<<63), append(piece(0, 0, 1<<63), piece(0, 0, 1<<63)...))
	f.Add(uint64(100), piece(0, 8, ^uint64(0)-4))
	f.Add(uint64(100), piece(2, 0, 0))
	f.Fuzz(func(t *testing.T, size uint64, raw []byte) {
		tensors := []transport.Tensor{{TensorDesc: transport.TensorDesc{Nbytes: size}}, {TensorDesc: transport.TensorDesc{Nbytes: size / 3}}}
		var pieces []transport.Piece
		for ; len(raw) >= 17 && len(pieces) < 64; raw = raw[17:] {
			pieces = append(pieces, transport.Piece{Tensor: uint32(raw[0] % 4), Offset: binary.LittleEndian.Uint64(raw[1:]), Length: binary.LittleEndian.Uint64(raw[9:])})
		}
		total, err := checkPieces(tensors, pieces)
		want, sum := true, uint64(0) // the reference, in 65-bit arithmetic
		for _, p := range pieces {
			end, carry := bits.Add64(p.Offset, p.Length, 0)
			var over uint64
			sum, over = bits.Add64(sum, p.Length, 0)
			want = want && int(p.Tensor) < len(tensors) && carry == 0 && end <= tensors[p.Tensor].Nbytes && over == 0
		}
		if (err == nil) != want || (err == nil && total != sum) {
			t.Fatalf("checkPieces(%v) of %d-byte tensors = %d, %v; want ok %v, %d", pieces, size, total, err, want, sum)
		}
		if err != nil && transport.StatusOf(err) != transport.ErrInvalidArgument {
			t.Fatalf("status %v: %v", transport.StatusOf(err), err)
		}
	})
}
