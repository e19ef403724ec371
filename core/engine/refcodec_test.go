package engine

import (
	"encoding/binary"
	"hash/crc32"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rdt-project/rdt/core/transport"
)

func sampleDesc(t testing.TB) *ObjectDesc {
	a, err := transport.NewTensorDesc(transport.Device{Type: transport.DeviceCPU}, transport.DType{Code: 2, Bits: 32, Lanes: 1}, []int64{2, 3})
	require.NoError(t, err)
	b, err := transport.NewTensorDesc(transport.Device{Type: transport.DeviceCUDA, ID: 1}, transport.DType{Code: 4, Bits: 16, Lanes: 1}, []int64{})
	require.NoError(t, err)
	owner := OwnerInfo{RuntimeID: transport.ID{1, 2, 3}, Address: "unix:///run/rdt/x.sock", HostID: "boot/pid/mnt"}
	return newObjectDesc(transport.ID{9, 9}, owner, "cma", []transport.TensorDesc{a, b}, nil)
}

func TestRefRoundTrip(t *testing.T) {
	d := sampleDesc(t)
	meta := map[string][]byte{"cma": {1, 2, 3}, "tcp": {}}
	b := EncodeRef(d, meta, 42)
	got, token, err := DecodeRef(b)
	require.NoError(t, err)
	assert.Equal(t, uint64(42), token)
	assert.Equal(t, d.ID, got.ID)
	assert.Equal(t, d.Owner, got.Owner)
	assert.Equal(t, "cma", got.Transport)
	assert.Equal(t, d.Tensors, got.Tensors)
	assert.Equal(t, uint64(24+2), got.Nbytes)
	assert.Equal(t, meta["cma"], got.Meta["cma"])
	assert.Contains(t, got.Meta, "tcp")
	// Deterministic: the same inputs encode to the same bytes.
	assert.Equal(t, b, EncodeRef(d, meta, 42))
}

func TestRefDecodeRejectsDamage(t *testing.T) {
	good := EncodeRef(sampleDesc(t), map[string][]byte{"cma": {7}}, 1)
	// Every truncation is corrupt.
	for n := 0; n < len(good); n++ {
		_, _, err := DecodeRef(good[:n])
		require.Equal(t, transport.ErrCorrupt, transport.StatusOf(err), "truncated to %d", n)
	}
	// Every single-bit flip is caught (checksum or header check).
	for i := 0; i < len(good); i++ {
		for bit := 0; bit < 8; bit++ {
			bad := append([]byte(nil), good...)
			bad[i] ^= 1 << bit
			_, _, err := DecodeRef(bad)
			require.Equal(t, transport.ErrCorrupt, transport.StatusOf(err), "flip byte %d bit %d", i, bit)
		}
	}
	// Trailing garbage.
	_, _, err := DecodeRef(append(append([]byte(nil), good...), 0))
	assert.Equal(t, transport.ErrCorrupt, transport.StatusOf(err))
}

// reseal fixes the length and checksum of a hand-edited ref, so that tests
// reach the body validation behind them.
func reseal(b []byte) []byte {
	body := b[refHeader : len(b)-refTrailer]
	binary.LittleEndian.PutUint32(b[8:12], uint32(len(body)))
	binary.LittleEndian.PutUint32(b[len(b)-4:], crc32.Checksum(b[:len(b)-4], castagnoli))
	return b
}

func TestRefDecodeValidatesBody(t *testing.T) {
	d := sampleDesc(t)
	cases := map[string]func(*ObjectDesc) *ObjectDesc{
		"zero id":         func(d *ObjectDesc) *ObjectDesc { d.ID = transport.ID{}; return d },
		"empty address":   func(d *ObjectDesc) *ObjectDesc { d.Owner.Address = ""; return d },
		"bad transport":   func(d *ObjectDesc) *ObjectDesc { d.Transport = "Not Canonical"; return d },
		"negative dim":    func(d *ObjectDesc) *ObjectDesc { d.Tensors[0].Shape = []int64{-1}; return d },
		"huge shape":      func(d *ObjectDesc) *ObjectDesc { d.Tensors[0].Shape = []int64{1 << 40, 1 << 40}; return d },
		"zero dtype bits": func(d *ObjectDesc) *ObjectDesc { d.Tensors[0].DType.Bits = 0; return d },
	}
	for name, edit := range cases {
		c := *d
		c.Tensors = append([]transport.TensorDesc(nil), d.Tensors...)
		c.Tensors[0].Shape = append([]int64(nil), d.Tensors[0].Shape...)
		b := EncodeRef(edit(&c), nil, 1)
		_, _, err := DecodeRef(b)
		assert.Equal(t, transport.ErrCorrupt, transport.StatusOf(err), name)
	}

	// A count claiming more tensors than the bytes can hold is refused
	// before anything is allocated for them.
	b := EncodeRef(d, nil, 1)
	off := refHeader + 16 + 16 + 8 + 2 + len(d.Owner.Address) + 2 + len(d.Owner.HostID) + 1 + len(d.Transport)
	binary.LittleEndian.PutUint32(b[off:], 1<<16)
	_, _, err := DecodeRef(reseal(b))
	assert.Equal(t, transport.ErrCorrupt, transport.StatusOf(err))
	assert.Contains(t, err.Error(), "cannot fit")

	binary.LittleEndian.PutUint16(b[4:6], 2)
	_, _, err = DecodeRef(reseal(b))
	assert.Contains(t, err.Error(), "version 2")
}

func FuzzDecodeRef(f *testing.F) {
	d := sampleDesc(f)
	f.Add(EncodeRef(d, map[string][]byte{"cma": {1, 2, 3, 4}}, 7))
	f.Add(EncodeRef(newObjectDesc(transport.ID{1}, OwnerInfo{RuntimeID: transport.ID{2}, Address: "inproc://x"}, "", nil, nil), nil, 0))
	f.Add([]byte("RDTR"))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		desc, token, err := DecodeRef(b)
		if err != nil {
			if transport.StatusOf(err) != transport.ErrCorrupt {
				t.Fatalf("error with status %v: %v", transport.StatusOf(err), err)
			}
			return
		}
		// Whatever decodes re-encodes to something that decodes the same.
		again, token2, err := DecodeRef(EncodeRef(desc, desc.Meta, token))
		if err != nil {
			t.Fatalf("re-encoding a decoded ref failed: %v", err)
		}
		if token2 != token || again.ID != desc.ID || again.Nbytes != desc.Nbytes || len(again.Tensors) != len(desc.Tensors) {
			t.Fatalf("round trip changed the ref")
		}
	})
}
