package engine

import (
	"math/bits"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rdt-project/rdt/core/transport"
)

// Object ids act as capabilities on the tcp data port: knowing one must
// tell nothing about another. Ids minted one after the other share no
// prefix and differ in about half of their bits.
func TestObjectIDsAreNotGuessableFromOneAnother(t *testing.T) {
	rt := newRuntime(t, "ids")
	buf := newHostBuf(t, 16)
	const n = 256
	ids := make([]transport.ID, n)
	seen := map[transport.ID]bool{}
	for i := range ids {
		ref, err := rt.Put([]transport.Tensor{tensorOf(t, buf)}, "", nil)
		require.NoError(t, err)
		ids[i] = ref.Desc().ID
		require.NoError(t, ref.Release())
		require.False(t, seen[ids[i]], "ids are unique")
		seen[ids[i]] = true
	}
	samePrefix, totalDiff := 0, 0
	for i := 1; i < n; i++ {
		a, b := ids[i-1], ids[i]
		if [8]byte(a[:8]) == [8]byte(b[:8]) {
			samePrefix++
		}
		for k := range a {
			totalDiff += bits.OnesCount8(a[k] ^ b[k])
		}
	}
	assert.Zero(t, samePrefix, "consecutive ids share no 8-byte prefix")
	// 128 random bits differ in 64 on average; a counter differs in a few.
	mean := float64(totalDiff) / (n - 1)
	assert.InDelta(t, 64, mean, 6, "consecutive ids differ in about half their bits")
}

// BenchmarkPut measures what minting an id costs a put:
// go test -run '^$' -bench Put ./core
func BenchmarkPut(b *testing.B) {
	rt := newRuntime(b, "bench")
	buf := newHostBuf(b, 64)
	tensors := []transport.Tensor{tensorOf(b, buf)}
	b.ReportAllocs()
	for b.Loop() {
		ref, err := rt.Put(tensors, "", nil)
		if err != nil {
			b.Fatal(err)
		}
		ref.Release()
	}
}

func BenchmarkNewObjectID(b *testing.B) {
	for b.Loop() {
		_ = transport.RandomID()
	}
}
