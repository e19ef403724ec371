package shm

import (
	"encoding/hex"
	"testing"

	"github.com/rdt-project/rdt/core/transport"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestMetadataRejectsCorruption(t *testing.T) {
	good := (&metadata{Path: "/run/x.sock", Object: transport.ObjectID{1}, Size: 128, Regions: []region{{0, 64}, {64, 64}}}).encode()
	_, err := decodeMetadata(good)
	require.NoError(t, err)
	for name, b := range map[string][]byte{
		"empty":     nil,
		"truncated": good[:len(good)-1],
		"trailing":  append(append([]byte{}, good...), 0),
		"relative":  (&metadata{Path: "x.sock"}).encode(),
		"outside":   (&metadata{Path: "/x", Size: 10, Regions: []region{{8, 4}}}).encode(),
		"wrap":      (&metadata{Path: "/x", Size: 10, Regions: []region{{^uint64(0), 2}}}).encode(),
	} {
		_, err := decodeMetadata(b)
		assert.Equal(t, transport.ErrCorrupt, transport.StatusOf(err), name)
	}
}

func FuzzDecodeMetadata(f *testing.F) {
	f.Add((&metadata{Path: "/run/x.sock", Object: transport.ObjectID{1}, Size: 128, Regions: []region{{0, 64}, {64, 64}}}).encode())
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := decodeMetadata(b)
		if err != nil {
			return
		}
		for _, r := range m.Regions {
			if r.Offset+r.Size > m.Size || r.Offset+r.Size < r.Offset {
				t.Fatalf("accepted a region outside the segment")
			}
		}
		if b[4] == metaVersion && string(m.encode()) != string(b) {
			t.Fatalf("re-encoding differs")
		}
	})
}

// TestMetadataEncodingIsPinned pins the byte layout of a fixed value: refs
// made by earlier builds must decode the same, so a change here is a
// format change and needs a new version.
func TestMetadataEncodingIsPinned(t *testing.T) {
	m := &metadata{Path: "/tmp/rdt-1.sock", Object: transport.ObjectID{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}, Size: 4096, Regions: []region{{0, 1024}, {1024, 3072}}}
	const v1 = "5253484d010f002f746d702f7264742d312e736f636b0102030405060708090a0b0c0d0e0f10001000000000000002000000000000000000000000040000000000000004000000000000000c000000000000"
	const own = "5253484d020f002f746d702f7264742d312e736f636b0102030405060708090a0b0c0d0e0f10001000000000000002000000000000000000000000040000000000000004000000000000000c000000000000" +
		"00000000000000000000000000000000" + "00000000" + "0000000000000000" + "0000000000000000"
	assert.Equal(t, own, hex.EncodeToString(m.encode()))
	for _, golden := range []string{v1, own} { // earlier builds' refs still decode
		b, err := hex.DecodeString(golden)
		require.NoError(t, err)
		got, err := decodeMetadata(b)
		require.NoError(t, err)
		assert.Equal(t, m, got)
	}
	m.Arena, m.Slot, m.Tag, m.Base = transport.ObjectID{0xa}, 3, 9, arenaTable
	const inArena = "5253484d020f002f746d702f7264742d312e736f636b0102030405060708090a0b0c0d0e0f10001000000000000002000000000000000000000000040000000000000004000000000000000c000000000000" +
		"0a000000000000000000000000000000" + "03000000" + "0900000000000000" + "0000010000000000"
	assert.Equal(t, inArena, hex.EncodeToString(m.encode()))
	got, err := decodeMetadata(m.encode())
	require.NoError(t, err)
	assert.Equal(t, m, got)
}

func TestMetadataRejectsBadArenaPlaces(t *testing.T) {
	for name, mut := range map[string]func(m *metadata){
		"no tag":        func(m *metadata) { m.Tag = 0 },
		"slot too high": func(m *metadata) { m.Slot = arenaSlots },
		"in the table":  func(m *metadata) { m.Base = arenaTable - 64 },
		"wraps":         func(m *metadata) { m.Base = ^uint64(0) - 8 },
	} {
		m := &metadata{Path: "/x", Object: transport.ObjectID{1}, Size: 64, Regions: []region{{0, 64}}, Arena: transport.ObjectID{2}, Slot: 1, Tag: 1, Base: arenaTable}
		_, err := decodeMetadata(m.encode())
		require.NoError(t, err)
		mut(m)
		_, err = decodeMetadata(m.encode())
		assert.Equal(t, transport.ErrCorrupt, transport.StatusOf(err), name)
	}
}
