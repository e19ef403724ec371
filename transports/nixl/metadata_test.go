package nixl

import (
	"strings"
	"testing"

	"github.com/rdt-project/rdt/core/transport"
	"github.com/rdt-project/rdt/core/transport/transporttest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestMetadataRoundTrip(t *testing.T) {
	m := sampleMeta()
	got, err := decodeMetadata(m.encode())
	require.NoError(t, err)
	assert.Equal(t, m, got)
}

func TestMetadataCorruption(t *testing.T) {
	good := sampleMeta().encode()
	for i := 0; i < len(good); i++ {
		_, err := decodeMetadata(good[:i])
		require.Error(t, err, "prefix %d", i)
		assert.Contains(t, []transport.Status{transport.ErrCorrupt, transport.ErrUnsupported}, transport.StatusOf(err))
	}
	bad := func(mut func(m *metadata)) error {
		m := sampleMeta()
		mut(m)
		_, err := decodeMetadata(m.encode())
		return err
	}
	assert.Equal(t, transport.ErrCorrupt, transport.StatusOf(bad(func(m *metadata) { m.Agent = "" })))
	assert.Equal(t, transport.ErrCorrupt, transport.StatusOf(bad(func(m *metadata) { m.Agent = "a b" })))
	assert.Equal(t, transport.ErrCorrupt, transport.StatusOf(bad(func(m *metadata) { m.Conn = nil })))
	assert.Equal(t, transport.ErrCorrupt, transport.StatusOf(bad(func(m *metadata) { m.Blobs = nil })))
	assert.Equal(t, transport.ErrCorrupt, transport.StatusOf(bad(func(m *metadata) { m.Regions[0].Mem = 9 })))
	assert.Equal(t, transport.ErrCorrupt, transport.StatusOf(bad(func(m *metadata) { m.Regions[0].Addr = ^uint64(0) })))
	assert.Equal(t, transport.ErrCorrupt, transport.StatusOf(bad(func(m *metadata) { m.Blobs = append(m.Blobs, []byte("x")) })))
	v := append([]byte(nil), good...)
	v[4] = 9
	_, err := decodeMetadata(v)
	assert.Equal(t, transport.ErrUnsupported, transport.StatusOf(err))
	assert.True(t, strings.Contains(err.Error(), "version"))
}

func FuzzDecodeMetadata(f *testing.F) {
	f.Add(sampleMeta().encode())
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := decodeMetadata(b)
		if err != nil {
			if s := transport.StatusOf(err); s != transport.ErrCorrupt && s != transport.ErrUnsupported {
				t.Fatalf("status %v for %v", s, err)
			}
			return
		}
		again, err := decodeMetadata(m.encode())
		if err != nil {
			t.Fatalf("re-encoding failed: %v", err)
		}
		if len(again.Regions) != len(m.Regions) {
			t.Fatal("round trip changed the regions")
		}
	})
}

// TestMetadataEncodingIsPinned pins the byte layout of a fixed value: refs
// made by earlier builds must decode the same, so a change here is a
// format change and needs a new version.
func TestMetadataEncodingIsPinned(t *testing.T) {
	m := &metadata{Version: metaVersion, Epoch: 5, Agent: "agent-1", Conn: []byte("conn"), Blobs: [][]byte{[]byte("blob")}, Regions: []region{{Addr: 0x1000, Size: 64, Dev: 0, Mem: memDRAM}, {Addr: 0x2000, Size: 32, Dev: 1, Mem: memVRAM}}}
	const golden = "524e584c020500000000000000076167656e742d3104000000636f6e6e0104000000626c6f6202000000001000000000000040000000000000000000000000002000000000000020000000000000000100000001"
	b := transporttest.PinnedEncoding(t, m, golden, (*metadata).encode, decodeMetadata)
	// Version 1, from earlier builds: the same layout, read as such (a
	// receiver then reads every tensor with descriptors of its own).
	b[4] = 1
	got, err := decodeMetadata(b)
	require.NoError(t, err)
	m.Version = 1
	assert.Equal(t, m, got)
	b[4] = 3
	_, err = decodeMetadata(b)
	assert.Equal(t, transport.ErrUnsupported, transport.StatusOf(err))
}

func sampleMeta() *metadata {
	return &metadata{
		Version: metaVersion, Epoch: 7, Agent: "0123abcd", Conn: []byte("conn"),
		Blobs:   [][]byte{[]byte("dram-md"), []byte("vram-md")},
		Regions: []region{{Addr: 4096, Size: 100, Mem: memDRAM}, {Addr: 1 << 40, Size: 8, Dev: 1, Mem: memVRAM}},
	}
}
