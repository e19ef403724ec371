package cma

import (
	"testing"

	"github.com/rdt-project/rdt/core/transport"
	"github.com/rdt-project/rdt/core/transport/transporttest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestMetadataRejectsCorruption(t *testing.T) {
	good := (&metadata{Pid: 7, StartTime: 9, Guard: slotSize, Token: 5, Regions: []region{{1, 2}}}).encode()
	m, err := decodeMetadata(good)
	require.NoError(t, err)
	assert.Equal(t, uint32(7), m.Pid)
	for name, b := range map[string][]byte{
		"empty":     nil,
		"truncated": good[:len(good)-1],
		"magic":     append([]byte("XCMA"), good[4:]...),
		"trailing":  append(append([]byte{}, good...), 0),
		"wrap":      (&metadata{Pid: 7, Guard: slotSize, Token: 5, Regions: []region{{^uint64(0), 2}}}).encode(),
		"pid zero":  (&metadata{Pid: 0, Guard: slotSize, Token: 5}).encode(),
		"no guard":  (&metadata{Pid: 7, StartTime: 9}).encode(),
		"odd guard": (&metadata{Pid: 7, Guard: 8, Token: 5}).encode(),
	} {
		_, err := decodeMetadata(b)
		assert.Error(t, err, name)
	}
	v2 := append([]byte{}, good...)
	v2[4] = 1
	_, err = decodeMetadata(v2)
	assert.Equal(t, transport.ErrUnsupported, transport.StatusOf(err))
}

func FuzzDecodeMetadata(f *testing.F) {
	f.Add((&metadata{Pid: 7, StartTime: 9, Guard: slotSize, Token: 5, Regions: []region{{1, 2}, {3, 4}}}).encode())
	f.Add([]byte("RCMA"))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := decodeMetadata(b)
		if err != nil {
			return
		}
		// Whatever decodes re-encodes to the same bytes.
		if string(m.encode()) != string(b) {
			t.Fatalf("re-encoding differs")
		}
	})
}

// TestMetadataEncodingIsPinned pins the byte layout of a fixed value: refs
// made by earlier builds must decode the same, so a change here is a
// format change and needs a new version.
func TestMetadataEncodingIsPinned(t *testing.T) {
	m := &metadata{Pid: 4242, StartTime: 0x1122334455667788, Guard: 0x7f0000001040, Token: 0x0123456789abcdef, Regions: []region{{0x1000, 0x20}, {0x2000, 0}}}
	const golden = "52434d410392100000887766554433221140100000007f0000efcdab8967452301020000000010000000000000200000000000000000200000000000000000000000000000"
	transporttest.PinnedEncoding(t, m, golden, (*metadata).encode, decodeMetadata)
}
