package tcp

import (
	"bytes"
	"encoding/binary"
	"math/rand"
	"net"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rdt-project/rdt/core/transport"
	"github.com/rdt-project/rdt/core/transport/transporttest"
)

// sendWriteFrame sends a write frame of write id with its bytes on c and
// returns the server's answer.
func sendWriteFrame(t *testing.T, c net.Conn, id uint64, p transport.Piece, data []byte) transport.Status {
	t.Helper()
	tag := newTag()
	req := request{Object: transport.ObjectID{24}, Tensor: p.Tensor, Offset: p.Offset, Length: p.Length, Tag: tag, Sizes: id, Write: true}
	_, err := (&net.Buffers{req.encode(nil), data}).WriteTo(c)
	require.NoError(t, err)
	st, got, _, err := readResponse(c)
	require.NoError(t, err)
	require.Equal(t, tag, got)
	return st
}

// A writer admitted for bytes [0, 16) of a tensor sends frames for bytes
// past the end of that range over the data connection: each is refused
// (the writer's request fails on it, so its outcome, and the owner's
// notice, say so) and no byte of the object changes; the connection stays
// framed, and a frame inside the range still lands.
func TestWriteFramesPastTheAdmittedRangeAreRefused(t *testing.T) {
	p := newPair(t, "", "")
	_, contents := p.put(t, 24, 128<<10)
	before := bytes.Clone(contents[0])
	p.host.Admit(7, []transport.Piece{{Tensor: 0, Offset: 0, Length: 16}})
	c := rawConn(t, p)
	for _, q := range []transport.Piece{{Offset: 4096, Length: 16}, {Offset: 8192, Length: 16}, {Offset: 65536, Length: 64 << 10}} {
		st := sendWriteFrame(t, c, 7, q, bytes.Repeat([]byte{0xee}, int(q.Length)))
		assert.Equal(t, transport.ErrInvalidArgument, st, "bytes [%d, +%d)", q.Offset, q.Length)
	}
	assert.True(t, bytes.Equal(before, contents[0]), "no byte of the object changed")

	patch := bytes.Repeat([]byte{0x5a}, 16)
	assert.Equal(t, transport.OK, sendWriteFrame(t, c, 7, transport.Piece{Length: 16}, patch))
	copy(before, patch)
	assert.True(t, bytes.Equal(before, contents[0]), "the admitted bytes landed, and only they")
}

// For random admitted ranges (as the engine admits them: inside their
// tensors, in any order, overlapping or not) and random write frames
// (inside them, straddling their ends, past them, past the tensor, with
// offsets near 2^64), the server lands exactly the frames whose every byte
// is admitted, and no other byte of the object changes.
func TestRandomWriteFramesLandOnlyInAdmittedBytes(t *testing.T) {
	p := newPair(t, "", "")
	sizes := []int{4096, 1000, 0, 70000}
	_, contents := p.put(t, 24, sizes...)
	c := rawConn(t, p)
	rng := rand.New(rand.NewSource(24))
	for id := uint64(1); id <= 300; id++ {
		admitted := transporttest.RandomAdmitted(rng, sizes)
		p.host.Admit(id, admitted)
		mask := transporttest.NewAdmittedMask(sizes, admitted)
		for range 8 {
			q := transporttest.RandomRange(rng, sizes, admitted)
			if q.Length > maxWrite {
				continue // not framed: the server closes the connection
			}
			before := transporttest.CloneAll(contents)
			data := make([]byte, q.Length)
			rng.Read(data)
			st := sendWriteFrame(t, c, id, q, data)
			want := before
			if q.Length > 0 && mask.Admits(q) {
				require.Equal(t, transport.OK, st, "write %d admitted for %v: frame %+v", id, admitted, q)
				want = transporttest.CloneAll(before)
				copy(want[q.Tensor][q.Offset:], data)
			} else if q.Length > 0 {
				require.NotEqual(t, transport.OK, st, "write %d admitted for %v: frame %+v", id, admitted, q)
			}
			require.NoError(t, mask.Untouched(before, contents), "write %d admitted for %v: frame %+v", id, admitted, q)
			for i := range want {
				require.True(t, bytes.Equal(want[i], contents[i]), "write %d admitted for %v: frame %+v: tensor %d", id, admitted, q, i)
			}
		}
		p.host.EndWrite(id)
	}
}

// FuzzCheckWrite runs the server's checks of a write frame (decode, then
// checkWrite against a small object and the pieces its write was
// admitted for, merged as the engine hands them out) and compares them
// with AdmittedMask: a frame with bytes is accepted exactly when every
// one of its bytes is admitted, and then lands in that range alone.
func FuzzCheckWrite(f *testing.F) {
	frame := func(tensor uint32, off, length uint64) []byte {
		return (&request{Object: transport.ObjectID{1}, Tensor: tensor, Offset: off, Length: length, Tag: 1, Sizes: 7, Write: true}).encode(nil)
	}
	admitted := func(pieces ...transport.Piece) []byte {
		b := []byte{1}
		for _, p := range pieces {
			b = binary.LittleEndian.AppendUint16(append(b, byte(p.Tensor)), uint16(p.Offset))
			b = binary.LittleEndian.AppendUint16(b, uint16(p.Length))
		}
		return b
	}
	first := transport.Piece{Tensor: 3, Length: 16}
	f.Add(frame(3, 0, 16), admitted(first))
	f.Add(frame(3, 1024, 16), admitted(first))
	f.Add(frame(3, 2048, 2048), admitted(first))
	f.Add(frame(3, 100, 50), admitted(transport.Piece{Tensor: 3, Offset: 40, Length: 30}, transport.Piece{Tensor: 3, Offset: 60, Length: 100}))
	f.Add(frame(0, ^uint64(0)-8, 16), admitted())
	f.Add(frame(0, 0, 1000), []byte{})
	sizes := []int{1000, 0, 16, 4096}
	var tensors []transport.Tensor
	for _, n := range sizes {
		tensors = append(tensors, transport.Tensor{TensorDesc: transport.TensorDesc{Device: transport.Device{Type: transport.DeviceCPU}, Nbytes: uint64(n)}})
	}
	f.Fuzz(func(t *testing.T, b, raw []byte) {
		req, err := decodeRequest(b)
		if err != nil || !req.Write {
			return // FuzzDecodeRequest covers the framing
		}
		// What the engine admits: nil (every byte) for no raw bytes, else
		// pieces inside the tensors, 5 bytes each (tensor, offset u16,
		// length u16) after the first.
		var pieces []transport.Piece
		if len(raw) > 0 {
			pieces = []transport.Piece{}
			for raw = raw[1:]; len(raw) >= 5 && len(pieces) < 16; raw = raw[5:] {
				p := transport.Piece{Tensor: uint32(raw[0] % 4), Offset: uint64(binary.LittleEndian.Uint16(raw[1:])), Length: uint64(binary.LittleEndian.Uint16(raw[3:]))}
				if p.Within(tensors[p.Tensor].Nbytes) {
					pieces = append(pieces, p)
				}
			}
		}
		q := transport.Piece{Tensor: req.Tensor, Offset: req.Offset, Length: req.Length}
		segs, st, msg := checkWrite(req, tensors, transport.MergePieces(pieces))
		admits := transporttest.NewAdmittedMask(sizes, pieces).Admits(q)
		switch {
		case st != transport.OK && (msg == "" || st != transport.ErrInvalidArgument):
			t.Fatalf("refusal %v without a clear message: %q", st, msg)
		case st == transport.OK && q.Length > 0 && !admits:
			t.Fatalf("a write admitted for %v accepted %+v", pieces, q)
		case st == transport.OK && (len(segs) != 1 || segs[0] != segment{tensor: int(q.Tensor), offset: q.Offset, length: q.Length}):
			t.Fatalf("a frame for %+v lands in %+v", q, segs)
		case st != transport.OK && q.Length > 0 && admits:
			t.Fatalf("a write admitted for %v refused %+v: %s", pieces, q, msg)
		}
	})
}
