package tcp

import (
	"bytes"
	"encoding/binary"
	"math/bits"
	"testing"

	"github.com/rdt-project/rdt/core/transport"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestRequestFrameRoundTrip(t *testing.T) {
	r := request{Object: transport.ObjectID{1, 2, 3}, Tensor: 7, Tensors: 3, Offset: 1 << 40, Length: maxChunk, Tag: 0x0123456789abcdef, Sizes: 42}
	b := r.encode(nil)
	require.Len(t, b, requestLen)
	got, err := decodeRequest(b)
	require.NoError(t, err)
	assert.Equal(t, r, got)
	// Ranges are the server's to check (the connection stays usable); a
	// frame that is not one closes it.
	b[0] = 'X'
	_, err = decodeRequest(b)
	assert.Equal(t, transport.ErrInvalidArgument, transport.StatusOf(err))
	_, err = decodeRequest(b[:requestLen-1])
	assert.Equal(t, transport.ErrInvalidArgument, transport.StatusOf(err))
	assert.Equal(t, r.Tag, frameTag(b), "a malformed frame's tag is still echoed")
}

func TestResponseHeaderRoundTrip(t *testing.T) {
	b := encodeResponse(nil, 0xfedcba9876543210, transport.ErrNotFound, "gone")
	require.Len(t, b, responseLen+4)
	st, n, tag, err := decodeResponseHeader(b[:responseLen])
	require.NoError(t, err)
	assert.Equal(t, transport.ErrNotFound, st)
	assert.Equal(t, 4, n)
	assert.Equal(t, uint64(0xfedcba9876543210), tag)
	assert.Equal(t, "gone", string(b[responseLen:]))
	// The message stays bounded, and so does what a header may announce.
	long := encodeResponse(nil, 1, transport.ErrNotFound, string(make([]byte, 2*maxMessage)))
	assert.Len(t, long, responseLen+maxMessage)
	binary.LittleEndian.PutUint32(long[4:], maxMessage+1)
	_, _, _, err = decodeResponseHeader(long)
	assert.Equal(t, transport.ErrCorrupt, transport.StatusOf(err))
	for range 1000 {
		require.NotZero(t, newTag(), "0 is the handshake's tag")
	}
}

// FuzzDecodeRequest runs the server's handling of a request frame, short
// of the memory: decode, then the range check against a small object.
// Whatever it accepts must be segments inside their tensors, in order,
// crossing at most maxRunTensors, adding up to the request's length.
func FuzzDecodeRequest(f *testing.F) {
	f.Add((&request{Object: transport.ObjectID{1}, Tensor: 0, Offset: 3, Length: 4, Tag: 1}).encode(nil))
	f.Add((&request{Object: transport.ObjectID{1}, Tensor: 1, Offset: 0, Length: 0, Tag: ^uint64(0)}).encode(nil))
	f.Add((&request{Object: transport.ObjectID{1}, Tensor: 0, Offset: 990, Length: 20, Tag: 2}).encode(nil))
	f.Add(make([]byte, requestLen))
	cpu := func(n uint64) transport.Tensor {
		return transport.Tensor{TensorDesc: transport.TensorDesc{Device: transport.Device{Type: transport.DeviceCPU}, Nbytes: n}}
	}
	tensors := []transport.Tensor{cpu(1000), cpu(0), cpu(16), cpu(1 << 62)}
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := decodeRequest(b)
		if err != nil {
			if transport.StatusOf(err) != transport.ErrInvalidArgument {
				t.Fatalf("unexpected status for %v", err)
			}
			return
		}
		if !bytes.Equal(r.encode(nil), b) {
			t.Fatalf("re-encoding differs")
		}
		segs, st, msg := checkRun(r, tensors, nil)
		if st != transport.OK {
			if msg == "" || st != transport.ErrInvalidArgument {
				t.Fatalf("refusal %v without a clear message: %q", st, msg)
			}
			return
		}
		// The first segment is where the range starts, or (the range
		// starting at its tensor's end) the start of a later tensor.
		first := len(segs) > 0 && (segs[0].tensor == int(r.Tensor) && segs[0].offset == r.Offset ||
			segs[0].tensor > int(r.Tensor) && segs[0].offset == 0 && r.Offset == tensors[r.Tensor].Nbytes)
		if r.Length > maxChunk || !first {
			t.Fatalf("accepted %+v as %+v", r, segs)
		}
		var total uint64
		for i, sg := range segs {
			end, carry := bits.Add64(sg.offset, sg.length, 0)
			if carry != 0 || end > tensors[sg.tensor].Nbytes || (i > 0 && (sg.offset != 0 || sg.tensor <= segs[i-1].tensor)) ||
				sg.tensor-int(r.Tensor) >= maxRunTensors {
				t.Fatalf("accepted %+v as %+v: segment %d is outside its tensor or out of order", r, segs, i)
			}
			total += sg.length
		}
		if total != r.Length {
			t.Fatalf("accepted %+v as %d bytes", r, total)
		}
	})
}
