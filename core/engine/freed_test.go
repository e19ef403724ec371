package engine

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rdt-project/rdt/core/transport"
)

// putAndFree puts an object, frees it, and returns its serialized bytes.
func putAndFree(t *testing.T, rt *Runtime) []byte {
	t.Helper()
	var released atomic.Int64
	ref, _ := putOne(t, rt, "", &released)
	b, err := ref.Serialize()
	require.NoError(t, err)
	again, err := rt.Deserialize(b) // takes the lease the bytes hold
	require.NoError(t, err)
	require.NoError(t, again.Release())
	require.NoError(t, ref.Release())
	return b
}

// withOtherID is b with its object id replaced by one nobody put.
func withOtherID(t *testing.T, b []byte) []byte {
	t.Helper()
	desc, token, err := DecodeRef(b)
	require.NoError(t, err)
	desc.ID = transport.RandomID()
	return EncodeRef(desc, nil, token)
}

func TestOwnerTellsFreedObjectsFromUnknownOnes(t *testing.T) {
	owner := newRuntime(t, "owner")
	freed := putAndFree(t, owner)
	never := withOtherID(t, freed)

	_, err := owner.Deserialize(freed)
	assert.Equal(t, transport.ErrNotFound, transport.StatusOf(err))
	assert.Contains(t, err.Error(), "was already freed by its owner owner")

	_, err = owner.Deserialize(never)
	assert.Equal(t, transport.ErrNotFound, transport.StatusOf(err))
	assert.Contains(t, err.Error(), "is unknown to its owner owner: it was never put there")
	assert.NotContains(t, err.Error(), "already freed")

	// A borrower hears the same from the owner.
	borrower := newRuntime(t, "borrower")
	for _, c := range []struct {
		bytes []byte
		want  string
	}{{freed, "was already freed"}, {never, "was never put there"}} {
		ref, err := borrower.Deserialize(c.bytes)
		require.NoError(t, err)
		out := newHostBuf(t, 4096)
		err = borrower.Get([]*Ref{ref}, []transport.Tensor{tensorOf(t, out)}, FetchOptions{}, 5*time.Second)
		assert.Equal(t, transport.ErrNotFound, transport.StatusOf(err), "%v", err)
		assert.Contains(t, err.Error(), "refused the borrow")
		assert.Contains(t, err.Error(), c.want)
		require.NoError(t, ref.Release())
	}
}

func TestOwnerRemembersABoundedNumberOfFreedObjects(t *testing.T) {
	owner := newRuntime(t, "owner")
	first := putAndFree(t, owner)
	for i := 0; i < freedRecordSize-1; i++ {
		putAndFree(t, owner)
	}
	_, err := owner.Deserialize(first)
	assert.Contains(t, err.Error(), "already freed", "the record holds the last %d", freedRecordSize)

	putAndFree(t, owner) // pushes the first out
	_, err = owner.Deserialize(first)
	assert.Equal(t, transport.ErrNotFound, transport.StatusOf(err))
	assert.Contains(t, err.Error(), "is unknown to its owner owner: it was never put there, or was freed long ago")
	owner.store.mu.Lock()
	defer owner.store.mu.Unlock()
	assert.Len(t, owner.store.freed.ids, freedRecordSize)
	assert.Len(t, owner.store.freed.ring, freedRecordSize)
}
