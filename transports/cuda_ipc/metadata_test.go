package cudaipc

import (
	"bytes"
	"encoding/binary"
	"testing"

	"github.com/rdt-project/rdt/core/transport"
	"github.com/rdt-project/rdt/core/transport/transporttest"
	"github.com/rdt-project/rdt/transports/internal/cuda"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestMetadataRoundTrip(t *testing.T) {
	m := sampleMeta()
	got, err := decodeMetadata(m.encode())
	require.NoError(t, err)
	assert.Equal(t, m, got)
}

func TestMetadataRejectsCorruption(t *testing.T) {
	good := sampleMeta().encode()
	mutate := func(f func(b []byte) []byte) []byte { return f(append([]byte(nil), good...)) }
	tensorAt := func(i int) int { return headerLen + 2*allocLen + i*tensorLen }
	cases := map[string][]byte{
		"empty":       {},
		"short":       good[:headerLen-1],
		"magic":       mutate(func(b []byte) []byte { b[0] = 'X'; return b }),
		"truncated":   good[:len(good)-1],
		"trailing":    append(append([]byte(nil), good...), 0),
		"huge count":  mutate(func(b []byte) []byte { binary.LittleEndian.PutUint32(b[21:], 1<<31); return b }),
		"no pid":      mutate(func(b []byte) []byte { binary.LittleEndian.PutUint32(b[5:], 0); return b }),
		"bad index":   mutate(func(b []byte) []byte { binary.LittleEndian.PutUint32(b[tensorAt(3):], 2); return b }),
		"past end":    mutate(func(b []byte) []byte { binary.LittleEndian.PutUint64(b[tensorAt(1)+4:], 1<<20+1); return b }),
		"wrapping":    mutate(func(b []byte) []byte { binary.LittleEndian.PutUint64(b[tensorAt(1)+4:], ^uint64(0)); return b }),
		"empty ref":   mutate(func(b []byte) []byte { binary.LittleEndian.PutUint64(b[tensorAt(2)+12:], 1); return b }),
		"zero size":   mutate(func(b []byte) []byte { binary.LittleEndian.PutUint64(b[headerLen+64+16:], 0); return b }),
		"wrap alloc":  mutate(func(b []byte) []byte { binary.LittleEndian.PutUint64(b[headerLen+64+16:], ^uint64(0)); return b }),
		"more allocs": mutate(func(b []byte) []byte { binary.LittleEndian.PutUint32(b[21:], 1); return b }),
	}
	for name, b := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := decodeMetadata(b)
			require.Error(t, err)
			assert.Equal(t, transport.ErrCorrupt, transport.StatusOf(err), "%v", err)
		})
	}
	v := mutate(func(b []byte) []byte { b[4] = 9; return b })
	_, err := decodeMetadata(v)
	assert.Equal(t, transport.ErrUnsupported, transport.StatusOf(err))
}

func FuzzDecodeMetadata(f *testing.F) {
	f.Add(sampleMeta().encode())
	f.Add(sampleVMMMeta().encode())
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := decodeMetadata(b)
		if err != nil {
			if st := transport.StatusOf(err); st != transport.ErrCorrupt && st != transport.ErrUnsupported {
				t.Fatalf("status %v for %v", st, err)
			}
			return
		}
		for _, tr := range m.Tensors {
			if tr.Alloc == noAlloc {
				continue
			}
			a := m.Allocs[tr.Alloc]
			if tr.Offset+tr.Nbytes > a.Size || tr.Offset+tr.Nbytes < tr.Offset {
				t.Fatalf("tensor outside its allocation accepted: %+v in %+v", tr, a)
			}
		}
		for _, a := range m.Allocs {
			if a.Chunks == nil {
				continue
			}
			var sum uint64
			for _, c := range a.Chunks {
				if c.Size == 0 || c.FD < 0 || sum+c.Size < sum {
					t.Fatalf("bad chunk accepted: %+v", c)
				}
				sum += c.Size
			}
			if sum != a.Size || len(a.Chunks) > maxChunks {
				t.Fatalf("chunks that do not make their allocation accepted: %+v", a)
			}
		}
		if !bytes.Equal(m.encode(), b) {
			t.Fatalf("decode/encode is not the identity")
		}
	})
}

// TestMetadataEncodingIsPinned pins the byte layout of a fixed value: refs
// made by earlier builds must decode the same, so a change here is a
// format change and needs a new version.
func TestMetadataEncodingIsPinned(t *testing.T) {
	m := &metadata{Pid: 77, Token: 0x0102030405060708, Allocs: []allocation{{Handle: cuda.IPCHandle{1, 2, 3, 63: 0xff}, BufferID: 9, Base: 0x7000000, Size: 0x100000, Device: cuda.UUID{0xaa, 15: 0xbb}}}, Tensors: []tensorRef{{Alloc: 0, Offset: 0x100, Nbytes: 256}, {Alloc: noAlloc}}}
	const golden = "52434950014d00000008070605040302010100000002000000010203000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000ff090000000000000000000007000000000000100000000000aa0000000000000000000000000000bb0000000000010000000000000001000000000000ffffffff00000000000000000000000000000000"
	transporttest.PinnedEncoding(t, m, golden, (*metadata).encode, decodeMetadata)
}

func sampleMeta() *metadata {
	m := &metadata{Pid: 4242, Token: 0x1234567890abcdef}
	for i := 0; i < 2; i++ {
		var a allocation
		for j := range a.Handle {
			a.Handle[j] = byte(i*64 + j)
		}
		a.BufferID = uint64(100 + i)
		a.Base = 0x7f0000000000 + uint64(i)<<32
		a.Size = 2 << 20
		a.Device = cuda.UUID{byte(i), 1, 2, 3}
		m.Allocs = append(m.Allocs, a)
	}
	m.Tensors = []tensorRef{{Alloc: 0, Offset: 0, Nbytes: 1 << 20}, {Alloc: 0, Offset: 1 << 20, Nbytes: 1 << 20},
		{Alloc: noAlloc}, {Alloc: 1, Offset: 512, Nbytes: 4096}}
	return m
}

// sampleVMMMeta is an object with a legacy allocation and a chunked one
// (two chunks), a tensor across the chunks' boundary.
func sampleVMMMeta() *metadata {
	m := sampleMeta()
	m.Allocs[1] = allocation{Base: 0x7f1000000000, Size: 4 << 20, Device: cuda.UUID{7, 15: 1},
		Chunks: []chunk{{FD: 31, ID: 5, Size: 2 << 20}, {FD: 32, ID: 6, Size: 2 << 20}}}
	m.Tensors[3] = tensorRef{Alloc: 1, Offset: 2<<20 - 512, Nbytes: 4096}
	return m
}

func TestMetadataVMMRoundTrip(t *testing.T) {
	m := sampleVMMMeta()
	b := m.encode()
	assert.Equal(t, byte(metaVersionVMM), b[4], "chunked allocations need version 2")
	got, err := decodeMetadata(b)
	require.NoError(t, err)
	assert.Equal(t, m, got)
	// Objects in cuMemAlloc'd memory only stay version 1: older builds read them.
	assert.Equal(t, byte(metaVersion), sampleMeta().encode()[4])
}

// A build that reads version 1 only refuses an object with chunked
// allocations as a version it does not know, not as corrupt.
func TestMetadataVMMRefusedByVersion1Readers(t *testing.T) {
	_, err := transport.OpenMetadata(sampleVMMMeta().encode(), metaMagic, metaVersion)
	require.Error(t, err)
	assert.Equal(t, transport.ErrUnsupported, transport.StatusOf(err), "%v", err)
}

func TestMetadataVMMRejectsCorruption(t *testing.T) {
	good := sampleVMMMeta().encode()
	mutate := func(f func(b []byte) []byte) []byte { return f(append([]byte(nil), good...)) }
	vmmAt := headerLen + 1 + allocLen // the chunked allocation's kind byte
	countAt := vmmAt + 1 + 8 + 8 + 16
	chunkAt := func(i int) int { return countAt + 4 + i*chunkLen }
	cases := map[string][]byte{
		"kind":         mutate(func(b []byte) []byte { b[vmmAt] = 7; return b }),
		"no chunked":   mutate(func(b []byte) []byte { b[vmmAt] = kindIPC; return b }),
		"huge chunks":  mutate(func(b []byte) []byte { binary.LittleEndian.PutUint32(b[countAt:], 1<<31); return b }),
		"many chunks":  mutate(func(b []byte) []byte { binary.LittleEndian.PutUint32(b[countAt:], 1000); return b }),
		"no chunks":    mutate(func(b []byte) []byte { binary.LittleEndian.PutUint32(b[countAt:], 0); return b }),
		"one chunk":    mutate(func(b []byte) []byte { binary.LittleEndian.PutUint32(b[countAt:], 1); return b }),
		"negative fd":  mutate(func(b []byte) []byte { binary.LittleEndian.PutUint32(b[chunkAt(0):], ^uint32(0)); return b }),
		"empty chunk":  mutate(func(b []byte) []byte { binary.LittleEndian.PutUint64(b[chunkAt(1)+12:], 0); return b }),
		"sum":          mutate(func(b []byte) []byte { binary.LittleEndian.PutUint64(b[chunkAt(1)+12:], 4<<20); return b }),
		"wrapping sum": mutate(func(b []byte) []byte { binary.LittleEndian.PutUint64(b[chunkAt(1)+12:], ^uint64(0)); return b }),
		"zero base":    mutate(func(b []byte) []byte { binary.LittleEndian.PutUint64(b[vmmAt+1:], 0); return b }),
		"truncated":    good[:len(good)-1],
		"trailing":     append(append([]byte(nil), good...), 0),
		"huge allocs":  mutate(func(b []byte) []byte { binary.LittleEndian.PutUint32(b[17:], 3); return b }),
		"past end":     mutate(func(b []byte) []byte { binary.LittleEndian.PutUint64(b[len(b)-tensorLen+4:], 4<<20); return b }),
	}
	for name, b := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := decodeMetadata(b)
			require.Error(t, err)
			assert.Equal(t, transport.ErrCorrupt, transport.StatusOf(err), "%v", err)
		})
	}
}

// TestMetadataVMMEncodingIsPinned pins version 2's byte layout.
func TestMetadataVMMEncodingIsPinned(t *testing.T) {
	m := &metadata{Pid: 77, Token: 0x0102030405060708,
		Allocs:  []allocation{{Base: 0x7000000, Size: 0x400000, Device: cuda.UUID{0xaa, 15: 0xbb}, Chunks: []chunk{{FD: 9, ID: 1, Size: 0x200000}, {FD: 10, ID: 2, Size: 0x200000}}}},
		Tensors: []tensorRef{{Alloc: 0, Offset: 0x1ff000, Nbytes: 0x2000}, {Alloc: noAlloc}}}
	const golden = "52434950024d000000080706050403020101000000020000000100000007000000000000400000000000aa0000000000000000000000000000bb0200000009000000010000000000000000002000000000000a000000020000000000000000002000000000000000000000f01f00000000000020000000000000ffffffff00000000000000000000000000000000"
	transporttest.PinnedEncoding(t, m, golden, (*metadata).encode, decodeMetadata)
}
