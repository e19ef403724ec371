package multiprocess

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rdt-project/rdt/core/engine"
	"github.com/rdt-project/rdt/core/transport"
)

// viewedBytes is what a view's tensors hold, as byte slices.
func viewedBytes(v *engine.View) [][]byte {
	out := make([][]byte, len(v.Tensors()))
	for i, x := range v.Tensors() {
		out[i] = transport.Bytes(x.Data, x.Nbytes)
	}
	return out
}

// A view of another process's object maps the owner's staged copy (no
// fetch, no copy) and holds a borrow: the owner frees the object only once
// the view is released, even with every other handle gone.
func TestViewHoldsABorrowUntilReleased(t *testing.T) {
	rt := parentRuntime(t, runtimeConfig{Name: "reader"})
	owner := startChild(t, runtimeConfig{Name: "owner"})
	ref, err := rt.Deserialize(owner.put("", 3, 5<<20, 100, 0))
	require.NoError(t, err)
	v, err := rt.View(ref, engine.ViewOptions{}, 30*time.Second)
	require.NoError(t, err)
	require.NoError(t, ref.Release())
	assert.True(t, v.Mapped())
	require.NoError(t, checkPattern(viewedBytes(v), 3))
	st := rt.Stats()
	assert.Equal(t, uint64(1), st.ViewsOpen)
	assert.Equal(t, uint64(5<<20+100), st.BytesViewed)
	assert.Zero(t, st.TransfersCompleted, "a view fetches nothing")

	owner.call(request{Op: "release_all"})
	time.Sleep(200 * time.Millisecond) // room for a wrongful free to show
	assert.Zero(t, owner.call(request{Op: "stats"}).Freed, "the view's borrow keeps the object")
	require.NoError(t, v.Release())
	require.Eventually(t, func() bool { return owner.call(request{Op: "stats"}).Freed == 1 }, 30*time.Second, 10*time.Millisecond,
		"released, the view lets the owner free the object")
	assert.Zero(t, rt.Stats().ViewsOpen)
	assert.Zero(t, rt.Stats().BytesViewed)
	assert.Equal(t, transport.ErrInvalidArgument, transport.StatusOf(v.Release()), "a second release")
}

// A view outlives its owner: the owner killed, its bytes are still the
// put's (the kernel keeps the segment while it is mapped), and a new view
// fails with PEER_UNAVAILABLE.
func TestViewOutlivesItsOwner(t *testing.T) {
	rt := parentRuntime(t, runtimeConfig{Name: "reader"})
	owner := startChild(t, runtimeConfig{Name: "owner"})
	ref, err := rt.Deserialize(owner.put("shm", 5, 3<<20, 4096))
	require.NoError(t, err)
	defer ref.Release()
	v, err := rt.View(ref, engine.ViewOptions{}, 30*time.Second)
	require.NoError(t, err)
	owner.kill()
	require.NoError(t, checkPattern(viewedBytes(v), 5))
	_, err = rt.View(ref, engine.ViewOptions{}, 30*time.Second)
	assert.Equal(t, transport.ErrPeerUnavailable, transport.StatusOf(err), "%v", err)
	require.NoError(t, checkPattern(viewedBytes(v), 5))
	require.NoError(t, v.Release())
}

// A runtime's own object is viewed in place; what cannot be viewed says so.
func TestViewOfOwnObjectAndRefusals(t *testing.T) {
	rt := parentRuntime(t, runtimeConfig{Name: "owner"})
	buf := hostMem(4096)
	defer freeMem(buf)
	ref, err := rt.Put([]transport.Tensor{tensorOver(buf)}, "", nil)
	require.NoError(t, err)
	defer ref.Release()
	v, err := rt.View(ref, engine.ViewOptions{}, time.Second)
	require.NoError(t, err)
	assert.False(t, v.Mapped())
	assert.Equal(t, addrOf(buf), v.Tensors()[0].Data, "the put tensor itself")
	require.NoError(t, v.Release())

	other := startChild(t, runtimeConfig{Name: "other"})
	remote, err := rt.Deserialize(other.put("tcp", 1, 4096))
	require.NoError(t, err)
	defer remote.Release()
	_, err = rt.View(remote, engine.ViewOptions{Transport: "tcp"}, 10*time.Second)
	assert.Equal(t, transport.ErrUnsupported, transport.StatusOf(err), "tcp cannot map: %v", err)
	v, err = rt.View(remote, engine.ViewOptions{}, 10*time.Second)
	require.NoError(t, err, "an object put over tcp is still viewed over shm on one host")
	require.NoError(t, checkPattern(viewedBytes(v), 1))
	require.NoError(t, v.Release())

	exposed, err := rt.Expose([]transport.Tensor{tensorOver(buf)}, "", nil)
	require.NoError(t, err)
	defer exposed.Release()
	_, err = rt.View(exposed, engine.ViewOptions{}, time.Second)
	assert.Equal(t, transport.ErrInvalidArgument, transport.StatusOf(err), "an exposed object is written, not viewed: %v", err)
}

// A ref whose shapes were rewritten (its checksum recomputed: no key is
// needed for that) is refused by a view as by a fetch: a reader never
// maps a size the owner's metadata does not give, so it cannot read past
// the mapping.
func TestViewRefusesARefThatDisagreesWithTheOwner(t *testing.T) {
	rt := parentRuntime(t, runtimeConfig{Name: "reader"})
	owner := startChild(t, runtimeConfig{Name: "owner"})
	blob := owner.put("shm", 7, 4096, 100)
	desc, token, err := engine.DecodeRef(blob)
	require.NoError(t, err)
	forge := func(change func(ts []transport.TensorDesc) []transport.TensorDesc) *engine.Ref {
		d := *desc
		d.Tensors = change(append([]transport.TensorDesc(nil), desc.Tensors...))
		ref, err := rt.Deserialize(engine.EncodeRef(&d, d.Meta, token))
		require.NoError(t, err, "a rewritten ref is well formed")
		t.Cleanup(func() { ref.Release() })
		return ref
	}
	reshape := func(i int, shape ...int64) func([]transport.TensorDesc) []transport.TensorDesc {
		return func(ts []transport.TensorDesc) []transport.TensorDesc {
			td, err := transport.NewTensorDesc(ts[i].Device, ts[i].DType, shape)
			require.NoError(t, err)
			ts[i] = td
			return ts
		}
	}
	for name, ref := range map[string]*engine.Ref{
		"tensor 0 enlarged to 64 MiB": forge(reshape(0, 64<<20)),
		"tensor 1 enlarged by a byte": forge(reshape(1, 101)),
		"tensor 0 shrunk":             forge(reshape(0, 16)),
		"a tensor dropped":            forge(func(ts []transport.TensorDesc) []transport.TensorDesc { return ts[:1] }),
		"a tensor added":              forge(func(ts []transport.TensorDesc) []transport.TensorDesc { return append(ts, ts[1]) }),
	} {
		_, err := rt.View(ref, engine.ViewOptions{}, 30*time.Second)
		assert.Equal(t, transport.ErrCorrupt, transport.StatusOf(err), "%s: %v", name, err)
		assert.Contains(t, fmt.Sprint(err), "refusing the ref", name)
		targets := make([]transport.Tensor, len(ref.Desc().Tensors))
		bufs := make([][]byte, len(targets))
		for i, td := range ref.Desc().Tensors {
			bufs[i] = hostMem(int(td.Nbytes))
			defer freeMem(bufs[i])
			targets[i] = transport.Tensor{TensorDesc: td, Data: addrOf(bufs[i]), Orig: addrOf(bufs[i])}
		}
		assert.Error(t, rt.Get([]*engine.Ref{ref}, targets, engine.FetchOptions{Transport: "shm"}, 30*time.Second), "%s: a fetch refuses it too", name)
	}
	assert.Zero(t, rt.Stats().ViewsOpen)

	// The ref as the owner made it is viewed.
	ref, err := rt.Deserialize(blob)
	require.NoError(t, err)
	defer ref.Release()
	v, err := rt.View(ref, engine.ViewOptions{}, 30*time.Second)
	require.NoError(t, err)
	require.NoError(t, checkPattern(viewedBytes(v), 7))
	require.NoError(t, v.Release())
}
