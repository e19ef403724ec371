package nccl

import (
	"testing"

	"github.com/rdt-project/rdt/core/transport"
	"github.com/rdt-project/rdt/core/transport/transporttest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestCMetaCodec(t *testing.T) {
	m := cmeta{Group: "workers:1", Instance: 1<<63 + 5, Src: 3, Dst: 0, Seq: 17}
	got, err := decodeCMeta(m.encode())
	require.NoError(t, err)
	assert.Equal(t, m, *got)
	b := m.encode()
	for i := 0; i < len(b); i++ {
		_, err := decodeCMeta(b[:i])
		assert.Equal(t, transport.ErrCorrupt, transport.StatusOf(err), "truncated at %d", i)
	}
	same := cmeta{Group: "g", Src: 1, Dst: 1}
	_, err = decodeCMeta(same.encode())
	assert.Equal(t, transport.ErrCorrupt, transport.StatusOf(err))
}

func FuzzDecodeCommunicatorMetadata(f *testing.F) {
	f.Add((&cmeta{Group: "g", Instance: 9, Src: 0, Dst: 1, Seq: 2}).encode())
	f.Add((&cmeta{Group: "pairs:a-b", Instance: 1, Src: 65535, Dst: 0, Seq: 1 << 40}).encode())
	f.Add([]byte{1, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := decodeCMeta(b)
		if err != nil {
			if transport.StatusOf(err) != transport.ErrCorrupt {
				t.Fatalf("status %v: %v", transport.StatusOf(err), err)
			}
			return
		}
		again, err := decodeCMeta(m.encode())
		if err != nil || *again != *m {
			t.Fatalf("re-encoding %+v: %+v, %v", m, again, err)
		}
	})
}

// TestCommunicatorMetadataEncodingIsPinned pins the byte layout of a fixed
// value: a peer running an earlier build must read it the same, so a change
// here is a format change and needs a new version.
func TestCommunicatorMetadataEncodingIsPinned(t *testing.T) {
	m := &cmeta{Group: "group-1", Instance: 7, Src: 1, Dst: 2, Seq: 9}
	const golden = "010767726f75702d31070000000000000001000000020000000900000000000000"
	transporttest.PinnedEncoding(t, m, golden, (*cmeta).encode, decodeCMeta)
}
