package tcp

import (
	"bytes"
	"strings"
	"testing"

	"github.com/rdt-project/rdt/core/transport"
	"github.com/rdt-project/rdt/core/transport/transporttest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestMetadataRejectsCorruption(t *testing.T) {
	key := strings.Repeat("k", maxKey)
	good := (&metadata{Endpoint: "127.0.0.1:5", Object: transport.ObjectID{1}, Tensors: 2, Key: key}).encode()
	m, err := decodeMetadata(good)
	require.NoError(t, err)
	assert.Equal(t, "127.0.0.1:5", m.Endpoint)
	assert.Equal(t, key, m.Key)
	noKey := (&metadata{Endpoint: "127.0.0.1:5", Object: transport.ObjectID{1}, Tensors: 2}).encode()
	m, err = decodeMetadata(noKey)
	require.NoError(t, err)
	assert.Empty(t, m.Key)
	newVersion := append([]byte{}, good...)
	newVersion[4] = 9
	oldVersion := append([]byte{}, noKey[:len(noKey)-1]...) // version 1 had no key
	oldVersion[4] = 1
	for name, b := range map[string][]byte{
		"empty":            nil,
		"truncated":        good[:len(good)-1],
		"trailing":         append(append([]byte{}, good...), 0),
		"magic":            append([]byte("XTCP"), good[4:]...),
		"no host":          (&metadata{}).encode(),
		"binary":           (&metadata{Endpoint: "a\x00b:1"}).encode(),
		"long":             append(append([]byte("RTCP\x02"), 0xff, 0xff), make([]byte, 70000)...),
		"version":          newVersion,
		"version 1":        oldVersion,
		"no key length":    noKey[:len(noKey)-1],
		"long key":         (&metadata{Endpoint: "h:1", Key: key + "k"}).encode(),
		"binary key":       (&metadata{Endpoint: "h:1", Key: "a\nb"}).encode(),
		"key past the end": append(noKey[:len(noKey)-1], 5, 'a', 'b'),
	} {
		_, err := decodeMetadata(b)
		st := transport.StatusOf(err)
		assert.True(t, st == transport.ErrCorrupt || (strings.HasPrefix(name, "version") && st == transport.ErrUnsupported), "%s: %v", name, err)
	}
	// Through Fetch: an error, not a panic.
	d, err := New(newHost(""))
	require.NoError(t, err)
	defer d.Close()
	_, err = d.Fetch(&transport.Transfer{}, nil, []byte("garbage"), nil)
	assert.Equal(t, transport.ErrCorrupt, transport.StatusOf(err))
}

func FuzzDecodeMetadata(f *testing.F) {
	f.Add((&metadata{Endpoint: "host:1", Object: transport.ObjectID{1}, Tensors: 1}).encode())
	f.Add((&metadata{Endpoint: "host:1", Object: transport.ObjectID{1}, Tensors: 1, Key: strings.Repeat("0f", 32)}).encode())
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := decodeMetadata(b)
		if err != nil {
			return
		}
		if !bytes.Equal(m.encode(), b) {
			t.Fatalf("re-encoding differs")
		}
	})
}

// TestMetadataEncodingIsPinned pins the byte layout of a fixed value: refs
// made by earlier builds must decode the same, so a change here is a
// format change and needs a new version.
func TestMetadataEncodingIsPinned(t *testing.T) {
	m := &metadata{Endpoint: "10.0.0.1:4567", Object: transport.ObjectID{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}, Tensors: 3, Key: "k3y"}
	const golden = "52544350020d0031302e302e302e313a343536370102030405060708090a0b0c0d0e0f1003000000036b3379"
	transporttest.PinnedEncoding(t, m, golden, (*metadata).encode, decodeMetadata)
}
