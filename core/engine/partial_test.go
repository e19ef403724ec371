package engine

import (
	"bytes"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rdt-project/rdt/core/transport"
)

var (
	f32  = transport.DType{Code: 2, Bits: 32, Lanes: 1}
	u8   = transport.DType{Code: 1, Bits: 8, Lanes: 1}
	int4 = transport.DType{Code: 0, Bits: 4, Lanes: 1}
)

// shaped is buf seen as a tensor of dt and shape.
func shaped(t *testing.T, buf *hostBuf, dt transport.DType, shape ...int64) transport.Tensor {
	t.Helper()
	d, err := transport.NewTensorDesc(transport.Device{Type: transport.DeviceCPU}, dt, shape)
	require.NoError(t, err)
	require.Equal(t, uint64(len(buf.b)), d.Nbytes)
	return transport.Tensor{TensorDesc: d, Data: buf.addr(), Orig: buf.addr()}
}

// stateDict puts a float32 matrix of 64 rows of 16 elements, 100 bytes and
// an int4 vector in the owner and returns the borrowed ref and the sources.
func (p *pair) stateDict(t *testing.T) (*Ref, []*hostBuf) {
	bufs := []*hostBuf{newHostBuf(t, 64*16*4), newHostBuf(t, 100), newHostBuf(t, 8)}
	for i, b := range bufs {
		b.fill(byte(0x10 * (i + 1)))
	}
	borrowed := p.lend(t, []transport.Tensor{
		shaped(t, bufs[0], f32, 64, 16), shaped(t, bufs[1], u8, 100), shaped(t, bufs[2], int4, 8),
	}, "mem")
	return borrowed, bufs
}

func rangedPair(t *testing.T) *pair {
	return newPair(t, func(m *memTransport) { m.ranges = true })
}

func TestPartialFetchTakesPiecesInAnyOrder(t *testing.T) {
	for _, oneSided := range []bool{true, false} {
		t.Run(fmt.Sprintf("one_sided=%v", oneSided), func(t *testing.T) {
			p := newPair(t, func(m *memTransport) { m.ranges, m.oneSided = true, oneSided })
			ref, src := p.stateDict(t)
			row := 16 * 4
			rows := newHostBuf(t, 8*row)  // rows 56..63 of the matrix
			one := newHostBuf(t, 1)       // byte 99
			whole := newHostBuf(t, 8)     // the int4 tensor
			first := newHostBuf(t, 2*row) // rows 0..1
			sources := []Range{
				{Ref: 0, Piece: transport.Piece{Tensor: 0, Offset: uint64(56 * row), Length: RestOfTensor}},
				{Ref: 0, Piece: transport.Piece{Tensor: 1, Offset: 99, Length: 1}},
				{Ref: 0, Piece: transport.Piece{Tensor: 2, Length: RestOfTensor}},
				{Ref: 0, Piece: transport.Piece{Tensor: 0, Offset: 0, Length: uint64(2 * row)}},
			}
			targets := []transport.Tensor{
				shaped(t, rows, f32, 8, 16), shaped(t, one, u8, 1), shaped(t, whole, int4, 8), shaped(t, first, f32, 32),
			}
			require.NoError(t, p.borrower.Get([]*Ref{ref}, targets, FetchOptions{Sources: sources}, 5*time.Second))
			assert.Equal(t, src[0].b[56*row:], rows.b)
			assert.Equal(t, src[1].b[99:], one.b)
			assert.Equal(t, src[2].b, whole.b)
			assert.Equal(t, src[0].b[:2*row], first.b)
			assert.Equal(t, uint64(8*row+1+8+2*row), p.borrower.Stats().BytesReceived, "only the pieces' bytes count")
		})
	}
}

func TestPartialFetchOfOwnObjectCopiesPieces(t *testing.T) {
	p := rangedPair(t)
	buf := newHostBuf(t, 4096)
	buf.fill(3)
	ref, err := p.owner.Put([]transport.Tensor{shaped(t, buf, f32, 1024)}, "", nil)
	require.NoError(t, err)
	defer ref.Release()
	out := newHostBuf(t, 16)
	src := []Range{{Piece: transport.Piece{Tensor: 0, Offset: 4080, Length: 16}}}
	require.NoError(t, p.owner.Get([]*Ref{ref}, []transport.Tensor{shaped(t, out, f32, 4)}, FetchOptions{Sources: src}, 5*time.Second))
	assert.Equal(t, buf.b[4080:], out.b)
}

// A ref that no source names is not fetched at all.
func TestPartialFetchSkipsUnnamedRefs(t *testing.T) {
	p := rangedPair(t)
	refs, src := p.share(t, 3, 4096, "mem")
	out := newHostBuf(t, 4096)
	sources := []Range{{Ref: 2, Piece: transport.Piece{Length: RestOfTensor}}}
	require.NoError(t, p.borrower.Get(refs, []transport.Tensor{tensorOf(t, out)}, FetchOptions{Sources: sources}, 5*time.Second))
	assert.Equal(t, src[2].b, out.b)
	assert.Equal(t, int64(1), p.dst.fetched.Load(), "one transfer, for the named ref")
}

// Sources that take every tensor whole, in order, are a whole fetch: any
// transport moves it.
func TestWholeInOrderSourcesNeedNoRanges(t *testing.T) {
	p := newPair(t, nil)
	refs, targets, src, dst := p.shareToFetch(t, 2, 4096)
	sources := []Range{{Ref: 0, Piece: transport.Piece{Length: RestOfTensor}}, {Ref: 1, Piece: transport.Piece{Length: 4096}}}
	require.NoError(t, p.borrower.Get(refs, targets, FetchOptions{Sources: sources}, 5*time.Second))
	assertLanded(t, src, dst)
}

func TestPartialFetchRefusedByATransportWithoutRanges(t *testing.T) {
	p := newPair(t, nil)
	refs, _ := p.share(t, 1, 4096, "mem")
	out := newHostBuf(t, 16)
	out.fill(9)
	sources := []Range{{Piece: transport.Piece{Offset: 16, Length: 16}}}
	err := p.borrower.Get(refs, []transport.Tensor{tensorOf(t, out)}, FetchOptions{Sources: sources}, 5*time.Second)
	require.Error(t, err)
	assert.Equal(t, transport.ErrUnsupported, transport.StatusOf(err))
	assert.Contains(t, err.Error(), "cannot serve a partial fetch")
	assert.Equal(t, int64(0), p.dst.fetched.Load(), "nothing started")
	want := newHostBuf(t, 16)
	want.fill(9)
	assert.Equal(t, want.b, out.b)
}

func TestPartialFetchRefusals(t *testing.T) {
	p := rangedPair(t)
	ref, _ := p.stateDict(t)
	row := uint64(64)
	pc := func(tensor uint32, off, n uint64) Range {
		return Range{Piece: transport.Piece{Tensor: tensor, Offset: off, Length: n}}
	}
	mk := func(n int) (*hostBuf, transport.Tensor) {
		b := newHostBuf(t, n)
		b.fill(0x77)
		return b, shaped(t, b, f32, int64(n/4))
	}
	for _, c := range []struct {
		what    string
		sources []Range
		sizes   []int // targets, float32
		want    string
	}{
		{"a ref that is not there", []Range{{Ref: 1, Piece: transport.Piece{Length: 16}}}, []int{16}, "names ref 1 of 1"},
		{"a tensor that is not there", []Range{pc(3, 0, 16)}, []int{16}, "has 3 tensors"},
		{"an offset past the end", []Range{pc(0, 4100, 4)}, []int{4}, "offset 4100 is past the tensor's 4096 bytes"},
		{"bytes past the end", []Range{pc(0, 4092, 8)}, []int{8}, "bytes [4092, 4092+8) are outside the tensor's 4096 bytes"},
		{"a length that wraps", []Range{pc(0, 8, ^uint64(0)-4)}, []int{8}, "outside the tensor's 4096 bytes"},
		{"an offset off the elements", []Range{pc(0, 2, 4)}, []int{4}, "do not fall on the 4-byte elements of float32"},
		{"a length off the elements", []Range{pc(0, 0, 6)}, []int{8}, "do not fall on the 4-byte elements"},
		{"a target of another size", []Range{pc(0, 0, row)}, []int{2 * int(row)}, "the target holds 128 bytes for a range of 64"},
		{"a target of another dtype", []Range{pc(1, 0, 4)}, []int{4}, "the target's dtype float32 is not the source's uint8"},
		{"a range of a sub-byte dtype", []Range{{Piece: transport.Piece{Tensor: 2, Offset: 0, Length: 4}}}, nil, "only fetched whole"},
		{"more sources than targets", []Range{pc(0, 0, 4), pc(0, 4, 4)}, []int{4}, "2 sources given for 1 targets"},
	} {
		t.Run(c.what, func(t *testing.T) {
			var bufs []*hostBuf
			var targets []transport.Tensor
			for _, n := range c.sizes {
				b, tg := mk(n)
				bufs, targets = append(bufs, b), append(targets, tg)
			}
			if c.sizes == nil { // the int4 case: a 4-byte target of int4
				b := newHostBuf(t, 4)
				b.fill(0x77)
				bufs, targets = append(bufs, b), append(targets, shaped(t, b, int4, 4))
			}
			err := p.borrower.Get([]*Ref{ref}, targets, FetchOptions{Sources: c.sources}, 5*time.Second)
			require.Error(t, err)
			assert.Equal(t, transport.ErrInvalidArgument, transport.StatusOf(err), "%v", err)
			assert.Contains(t, err.Error(), c.want)
			for _, b := range bufs {
				want := newHostBuf(t, len(b.b))
				want.fill(0x77)
				assert.True(t, bytes.Equal(want.b, b.b), "a refused fetch wrote its target")
			}
		})
	}
	assert.Equal(t, int64(0), p.dst.fetched.Load(), "no refused fetch reached the transport")
}

func TestOverlappingTargetsAreRefused(t *testing.T) {
	p := rangedPair(t)
	refs, src := p.share(t, 2, 4096, "mem")
	shared := newHostBuf(t, 4096+2048)
	a := tensorOf(t, &hostBuf{b: shared.b[:4096]})
	b := tensorOf(t, &hostBuf{b: shared.b[2048:]})
	err := p.borrower.Get(refs, []transport.Tensor{a, b}, FetchOptions{}, 5*time.Second)
	require.Error(t, err)
	assert.Equal(t, transport.ErrInvalidArgument, transport.StatusOf(err))
	assert.Contains(t, err.Error(), "targets overlap")

	// Given in reverse address order, so that the check must sort.
	sources := []Range{{Ref: 0, Piece: transport.Piece{Offset: 0, Length: 2048}}, {Ref: 1, Piece: transport.Piece{Offset: 0, Length: 4096}}}
	late := tensorOf(t, &hostBuf{b: shared.b[4096:]})
	early := tensorOf(t, &hostBuf{b: shared.b[:4096]})
	err = p.borrower.Get(refs, []transport.Tensor{late, early}, FetchOptions{Sources: sources}, 5*time.Second)
	require.NoError(t, err, "touching targets do not overlap")
	assert.Equal(t, src[0].b[:2048], shared.b[4096:])
	assert.Equal(t, src[1].b, shared.b[:4096])

	overlapping := []transport.Tensor{tensorOf(t, &hostBuf{b: shared.b[4092 : 4092+2048]}), early}
	err = p.borrower.Get(refs, overlapping, FetchOptions{Sources: sources}, 5*time.Second)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "targets overlap")
}

// An object of MaxTensors one-byte tensors is put, travels as a ref and is
// fetched; one more tensor is refused at put, naming the limit.
func TestObjectOfMaxTensors(t *testing.T) {
	if testing.Short() {
		t.Skip("moves a ref of a million tensors")
	}
	p := rangedPair(t)
	n := transport.MaxTensors
	src := newHostBuf(t, n+1)
	src.fill(5)
	desc, err := transport.NewTensorDesc(transport.Device{Type: transport.DeviceCPU}, u8, []int64{1})
	require.NoError(t, err)
	tensors := make([]transport.Tensor, n+1)
	for i := range tensors {
		tensors[i] = transport.Tensor{TensorDesc: desc, Data: src.addr() + uintptr(i), Orig: src.addr() + uintptr(i)}
	}
	_, err = p.owner.Put(tensors, "mem", nil)
	require.Error(t, err)
	assert.Equal(t, transport.ErrInvalidArgument, transport.StatusOf(err))
	assert.Contains(t, err.Error(), fmt.Sprintf("%d tensors is over the limit of %d per object", n+1, n))

	borrowed := p.lend(t, tensors[:n], "mem")
	require.Len(t, borrowed.Desc().Tensors, n)

	dst := newHostBuf(t, n)
	targets := make([]transport.Tensor, n)
	for i := range targets {
		targets[i] = transport.Tensor{TensorDesc: desc, Data: dst.addr() + uintptr(i), Orig: dst.addr() + uintptr(i)}
	}
	require.NoError(t, p.borrower.Get([]*Ref{borrowed}, targets, FetchOptions{}, time.Minute))
	assert.True(t, bytes.Equal(src.b[:n], dst.b))

	// The last byte alone, as a partial fetch of the last tensor.
	one := newHostBuf(t, 1)
	sources := []Range{{Piece: transport.Piece{Tensor: uint32(n - 1), Length: RestOfTensor}}}
	require.NoError(t, p.borrower.Get([]*Ref{borrowed}, []transport.Tensor{{TensorDesc: desc, Data: one.addr()}}, FetchOptions{Sources: sources}, time.Minute))
	assert.Equal(t, src.b[n-1], one.b[0])
}
