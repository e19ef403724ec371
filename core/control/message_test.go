package control

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"reflect"
	"runtime"
	"strings"
	"testing"
	"testing/iotest"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rdt-project/rdt/core/transport"
)

func FuzzDecodeMessage(f *testing.F) {
	for _, c := range wireCases() { // a frame of every kind
		f.Add(c.m.Encode()[4:])
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := DecodeMessage(b)
		if err != nil {
			if transport.StatusOf(err) != transport.ErrCorrupt {
				t.Fatalf("status %v: %v", transport.StatusOf(err), err)
			}
			return
		}
		again, err := DecodeMessage(m.Encode()[4:])
		if err != nil {
			t.Fatalf("re-encoding a decoded %s failed: %v", m.Kind, err)
		}
		if !reflect.DeepEqual(again, m) {
			t.Fatalf("round trip changed the %s message: %+v, then %+v", m.Kind, m, again)
		}
	})
}

func TestReadFrameBounds(t *testing.T) {
	_, err := ReadFrame(bytes.NewReader(binary.LittleEndian.AppendUint32(nil, MaxFrame+1)), nil, MaxFrame)
	assert.Equal(t, transport.ErrCorrupt, transport.StatusOf(err))
	_, err = ReadFrame(bytes.NewReader(binary.LittleEndian.AppendUint32(nil, 3)), nil, MaxFrame)
	assert.Equal(t, transport.ErrCorrupt, transport.StatusOf(err))
	_, err = ReadFrame(bytes.NewReader(append(binary.LittleEndian.AppendUint32(nil, 100), 1, 2)), nil, MaxFrame)
	assert.Error(t, err, "a frame cut short is an error")
	_, err = ReadFrame(bytes.NewReader(binary.LittleEndian.AppendUint32(nil, MaxPreAuthFrame+1)), nil, MaxPreAuthFrame)
	assert.Equal(t, transport.ErrCorrupt, transport.StatusOf(err), "the handshake's own bound")
}

func TestReadFrameGrowsAsBytesArrive(t *testing.T) {
	// A length prefix alone costs a chunk, not the length.
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	before := ms.TotalAlloc
	frame := append(binary.LittleEndian.AppendUint32(nil, MaxFrame), make([]byte, 100)...)
	_, err := ReadFrame(bufio.NewReader(strings.NewReader(string(frame))), nil, MaxFrame)
	require.Error(t, err, "cut short")
	runtime.ReadMemStats(&ms)
	assert.Less(t, ms.TotalAlloc-before, uint64(1<<20), "bytes allocated for a 17 MiB prefix and 100 bytes")

	// A real large frame still arrives whole, however it is cut.
	body := make([]byte, 1<<20+17)
	for i := range body {
		body[i] = byte(i * 31)
	}
	frame = append(binary.LittleEndian.AppendUint32(nil, uint32(len(body))), body...)
	got, err := ReadFrame(iotest.OneByteReader(bytes.NewReader(frame)), nil, MaxFrame)
	require.NoError(t, err)
	assert.Equal(t, body, got)
}

func TestWriteFlagsAreChecked(t *testing.T) {
	for _, m := range []*Message{
		{Kind: KindWriteOpen, ID: 1, Transport: "cma", Flags: WriteKeep},
		{Kind: KindWriteDone, Flags: WriteKeep | WriteClose},
		{Kind: KindWriteDone, Flags: 1 << 7},
	} {
		_, err := DecodeMessage(m.Encode()[4:])
		assert.Equal(t, transport.ErrCorrupt, transport.StatusOf(err), "%s with flags %#x", m.Kind, m.Flags)
	}
	m, err := DecodeMessage((&Message{Kind: KindWriteDone, Token: 5, Flags: WriteClose}).Encode()[4:])
	require.NoError(t, err)
	assert.Equal(t, WriteClose, m.Flags)
	assert.Equal(t, uint64(5), m.Token)
}

// Every kind has a name and a codec, and nothing past the last kind has
// either.
func TestEveryKindHasACodec(t *testing.T) {
	for k := Kind(1); k < KindEnd; k++ {
		assert.NotEmpty(t, KindNames[k], "kind %d has no name", k)
		c := codecOf(k)
		if assert.NotNil(t, c, "kind %d (%s) has no codec", k, k) {
			assert.NotNil(t, c.encode, "kind %d (%s) has no encode", k, k)
		}
	}
	assert.Nil(t, codecOf(0))
	assert.Nil(t, codecOf(KindEnd))
	assert.Equal(t, "unknown", KindEnd.String())
}
