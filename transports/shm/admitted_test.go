package shm

import (
	"bytes"
	"math/bits"
	"math/rand"
	"net"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rdt-project/rdt/core/transport"
	"github.com/rdt-project/rdt/core/transport/transporttest"
)

// dialOwner connects to the segment server of meta; the connection is
// closed when the test ends.
func dialOwner(t *testing.T, meta []byte) net.Conn {
	m, err := decodeMetadata(meta)
	require.NoError(t, err)
	c, err := net.Dial("unix", m.Path)
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	return c
}

// sendWrite sends a write request of write id into object obj for pieces
// on c, with data after it when the write goes inline, and returns the
// reply's status (for a staged write, the answer to the request: OK comes
// with the staging area).
func sendWrite(t *testing.T, c net.Conn, obj byte, id uint64, pieces []transport.Piece, data []byte) transport.Status {
	t.Helper()
	req := encodeWriteRequest(transport.ObjectID{obj}, id, pieces)
	if len(data) <= inlineMax {
		req = append(req, data...)
	}
	_, err := c.Write(req)
	require.NoError(t, err)
	return readStatus(t, c)
}

// A writer admitted for bytes [0, 16) of a tensor asks the segment server
// to land bytes past the end of that range, inline (16 bytes) and staged
// (64 KiB): each is refused before a byte lands, and so is the same write
// made by a writer's Write (whose outcome the owner's notice reports); no
// byte of the object changes, and bytes inside the range still land.
func TestWritesPastTheAdmittedRangeAreRefused(t *testing.T) {
	o := newOwner(t)
	meta, mem := o.expose(t, 34, 128<<10)
	before := bytes.Clone(mem[0])
	o.admit(7, transport.Piece{Length: 16})
	c := dialOwner(t, meta)
	w := newTransport(t)
	for _, q := range []transport.Piece{{Offset: 4096, Length: 16}, {Offset: 8192, Length: 16}, {Offset: 65536, Length: 64 << 10}} {
		data := bytes.Repeat([]byte{0xee}, int(q.Length))
		assert.Equal(t, transport.ErrInvalidArgument, sendWrite(t, c, 34, 7, []transport.Piece{q}, data), "bytes [%d, +%d)", q.Offset, q.Length)
		err := writeAndWait(t, w, meta, 7, []transport.Piece{q}, data)
		assert.Equal(t, transport.ErrInvalidArgument, transport.StatusOf(err), "bytes [%d, +%d) through Write: %v", q.Offset, q.Length, err)
	}
	assert.True(t, bytes.Equal(before, mem[0]), "no byte of the object changed")

	patch := bytes.Repeat([]byte{0x5a}, 16)
	assert.Equal(t, transport.OK, sendWrite(t, c, 34, 7, []transport.Piece{{Length: 16}}, patch))
	copy(before, patch)
	assert.True(t, bytes.Equal(before, mem[0]), "the admitted bytes landed, and only they")
}

// For random admitted ranges (as the engine admits them: inside their
// tensors, in any order, overlapping or not) and random writes of one to
// three pieces (inside them, straddling their ends, past them, past the
// tensor, at offsets near 2^64), inline and staged, the segment server
// lands exactly the writes whose every byte is admitted, and no other
// byte of the object changes.
func TestRandomWritesLandOnlyInAdmittedBytes(t *testing.T) {
	o := newOwner(t)
	sizes := []int{4096, 1000, 0, 70000}
	meta, mem := o.expose(t, 35, sizes...)
	w := newTransport(t)
	c := dialOwner(t, meta)
	rng := rand.New(rand.NewSource(35))
	for id := uint64(1); id <= 300; id++ {
		admitted := transporttest.RandomAdmitted(rng, sizes)
		o.host.Admit(id, admitted)
		mask := transporttest.NewAdmittedMask(sizes, admitted)
		for range 6 {
			pieces := make([]transport.Piece, 1+rng.Intn(3))
			var total uint64
			wraps, admits, empty := false, true, false
			for i := range pieces {
				q := transporttest.RandomRange(rng, sizes, admitted)
				pieces[i] = q
				_, carry := bits.Add64(q.Offset, q.Length, 0)
				wraps = wraps || carry != 0
				admits = admits && mask.Admits(q)
				empty = empty || q.Length == 0
				total += q.Length
			}
			before := transporttest.CloneAll(mem)
			data := make([]byte, total)
			rng.Read(data)
			var st transport.Status
			switch {
			case wraps:
				// Not framed: refused as corrupt, and the connection closed.
				assert.Equal(t, transport.ErrCorrupt, sendWrite(t, c, 35, id, pieces, data[:0]), "write %d: pieces %v", id, pieces)
				c = dialOwner(t, meta)
				st = transport.ErrCorrupt
			case total <= inlineMax:
				st = sendWrite(t, c, 35, id, pieces, data)
			default:
				var sources [][]byte
				for _, q := range pieces {
					sources, data = append(sources, data[:q.Length]), data[q.Length:]
				}
				st = transport.StatusOf(writeAndWait(t, w, meta, id, pieces, sources...))
				data = bytes.Join(sources, nil)
			}
			want := before
			if st == transport.OK {
				require.True(t, admits, "write %d admitted for %v landed pieces %v", id, admitted, pieces)
				want = transporttest.CloneAll(before)
				at := data
				for _, q := range pieces {
					copy(want[q.Tensor][q.Offset:], at[:q.Length])
					at = at[q.Length:]
				}
			} else if admits && !empty {
				t.Fatalf("write %d admitted for %v: pieces %v, every byte admitted, refused: %v", id, admitted, pieces, st)
			}
			require.NoError(t, mask.Untouched(before, mem), "write %d admitted for %v: pieces %v", id, admitted, pieces)
			for i := range want {
				require.True(t, bytes.Equal(want[i], mem[i]), "write %d admitted for %v: pieces %v: tensor %d", id, admitted, pieces, i)
			}
		}
		o.host.EndWrite(id)
	}
}

// FuzzDecodeWriteRequest decodes what a writer sends before its bytes:
// a request that decodes re-encodes to the same bytes, names at most
// maxRegions pieces, none of which wraps, and their total is their sum;
// anything else is corrupt.
func FuzzDecodeWriteRequest(f *testing.F) {
	obj := transport.ObjectID{34}
	f.Add(encodeWriteRequest(obj, 7, []transport.Piece{{Offset: 4096, Length: 16}}))
	f.Add(encodeWriteRequest(obj, 7, []transport.Piece{{Offset: 65536, Length: 65536}, {Tensor: 1, Offset: 8, Length: 16}}))
	f.Add(encodeWriteRequest(obj, 7, []transport.Piece{{Offset: 8, Length: ^uint64(0) - 4}}))
	f.Add(encodeWriteRequest(obj, 7, []transport.Piece{{Length: 1 << 63}, {Length: 1 << 63}}))
	f.Add(encodeWriteRequest(obj, 7, nil))
	f.Fuzz(func(t *testing.T, b []byte) {
		if len(b) < writeHeaderLen {
			return
		}
		h, err := decodeWriteHeader(b[:writeHeaderLen])
		if err != nil {
			require.Equal(t, transport.ErrCorrupt, transport.StatusOf(err), "%v", err)
			return
		}
		require.LessOrEqual(t, h.count, uint32(maxRegions))
		raw := b[writeHeaderLen:]
		if uint64(len(raw)) < uint64(h.count)*pieceLen {
			return
		}
		raw = raw[:int(h.count)*pieceLen]
		pieces, total, err := decodePieces(raw)
		if err != nil {
			require.Equal(t, transport.ErrCorrupt, transport.StatusOf(err), "%v", err)
			return
		}
		var sum uint64
		for _, p := range pieces {
			_, carry := bits.Add64(p.Offset, p.Length, 0)
			var over uint64
			sum, over = bits.Add64(sum, p.Length, 0)
			require.Zero(t, carry|over, "piece %+v wraps, or the total does", p)
		}
		require.Equal(t, sum, total)
		require.Equal(t, b[:writeHeaderLen+len(raw)], encodeWriteRequest(h.obj, h.writeID, pieces), "re-encoding differs")
	})
}

// FuzzCheckWritePieces runs the segment server's check of a write's
// pieces (as decoded from a request) against a small object and the
// pieces its write was admitted for, merged as the engine hands them out,
// and compares it with AdmittedMask: a write whose pieces all have bytes
// is accepted exactly when every one of those bytes is admitted, and none
// with a byte outside is ever accepted.
func FuzzCheckWritePieces(f *testing.F) {
	wire := func(pieces ...transport.Piece) []byte {
		return encodeWriteRequest(transport.ObjectID{}, 0, pieces)[writeHeaderLen:]
	}
	admitted := func(pieces ...transport.Piece) []byte { return append([]byte{1}, wire(pieces...)...) }
	first := transport.Piece{Tensor: 3, Length: 16}
	f.Add(wire(first), admitted(first))
	f.Add(wire(transport.Piece{Tensor: 3, Offset: 1024, Length: 16}), admitted(first))
	f.Add(wire(transport.Piece{Tensor: 3, Offset: 2048, Length: 2048}, first), admitted(first))
	f.Add(wire(transport.Piece{Tensor: 0, Offset: 100, Length: 50}), admitted(transport.Piece{Offset: 40, Length: 30}, transport.Piece{Offset: 60, Length: 100}))
	f.Add(wire(transport.Piece{Tensor: 0, Offset: ^uint64(0) - 8, Length: 8}), []byte{})
	sizes := []int{1000, 0, 16, 4096}
	var tensors []transport.Tensor
	for _, n := range sizes {
		tensors = append(tensors, transport.Tensor{TensorDesc: transport.TensorDesc{Device: transport.Device{Type: transport.DeviceCPU}, Nbytes: uint64(n)}})
	}
	f.Fuzz(func(t *testing.T, rawPieces, rawAdmitted []byte) {
		pieces, _, err := decodePieces(rawPieces[:len(rawPieces)/pieceLen*pieceLen])
		if err != nil {
			return // FuzzDecodeWriteRequest covers the decoding
		}
		// What the engine admits: nil (every byte) for no raw bytes, else
		// the pieces after the first byte that lie inside the tensors.
		var admitted []transport.Piece
		if len(rawAdmitted) > 0 {
			admitted = []transport.Piece{}
			named, _, _ := decodePieces(rawAdmitted[1 : 1+(len(rawAdmitted)-1)/pieceLen*pieceLen])
			for _, p := range named {
				if int(p.Tensor) < len(tensors) && p.Within(tensors[p.Tensor].Nbytes) {
					admitted = append(admitted, p)
				}
			}
		}
		mask := transporttest.NewAdmittedMask(sizes, admitted)
		admits, empty := true, false
		for _, p := range pieces {
			admits = admits && mask.Admits(p)
			empty = empty || p.Length == 0
		}
		err = checkPieces(tensors, transport.MergePieces(admitted), pieces)
		if err == nil && !admits {
			t.Fatalf("a write admitted for %v accepted pieces %v", admitted, pieces)
		}
		if err != nil && admits && !empty {
			t.Fatalf("a write admitted for %v refused pieces %v: %v", admitted, pieces, err)
		}
	})
}

// FuzzDecodeWriteReplies decodes what an owner answers a writer (a reply)
// and what a writer tells an owner of each chunk: whatever decodes
// re-encodes to the same bytes.
func FuzzDecodeWriteReplies(f *testing.F) {
	f.Add(encodeReply(transport.OK, "", 4096+2*(16<<20), flagStaging))
	f.Add(encodeReply(transport.ErrInvalidArgument, "bytes outside the ranges the write was admitted for", 0, 0))
	f.Add(encodeReply(transport.OK, "", 65536, 0))
	f.Add(encodeChunk(1, 16<<20))
	f.Fuzz(func(t *testing.T, b []byte) {
		if h, err := decodeWriteReply(b); err == nil {
			require.LessOrEqual(t, h.msgLen, uint32(maxMessage))
			want := encodeReply(h.status, string(make([]byte, h.msgLen)), h.size, h.flags)[:replyLen]
			require.Equal(t, want, b[:replyLen], "re-encoding the reply differs")
		} else {
			require.Equal(t, transport.ErrCorrupt, transport.StatusOf(err), "%v", err)
		}
		if len(b) != chunkLen {
			return
		}
		if slot, n, err := decodeChunk(b); err == nil {
			require.Equal(t, b, encodeChunk(slot, n), "re-encoding the chunk differs")
		} else {
			require.Equal(t, transport.ErrCorrupt, transport.StatusOf(err), "%v", err)
		}
	})
}
