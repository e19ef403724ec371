package multiprocess

import (
	"os"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rdt-project/rdt/core/engine"
	"github.com/rdt-project/rdt/core/transport"
)

// openFDs counts this process's open descriptors.
func openFDs(t *testing.T) int {
	t.Helper()
	entries, err := os.ReadDir("/proc/self/fd")
	require.NoError(t, err)
	return len(entries)
}

// shortLivedSource starts a child, fetches one object from it over each of
// the given transports ("" is the automatic choice), and makes it go away:
// it exits cleanly, or is killed when kill is set. It returns once the
// child has exited.
func shortLivedSource(t *testing.T, parent *engine.Runtime, seed int, kill bool, transports ...string) {
	t.Helper()
	src := startChild(t, runtimeConfig{Name: "short-lived"})
	for i, transportName := range transports {
		fetchAndCheck(t, parent, src.put(transportName, seed+i, 4096, 300<<10), seed+i, "")
	}
	if kill {
		src.kill()
	} else {
		src.exit()
	}
}

// A long-lived receiver fed by many short-lived sources must not keep
// anything per source once it is gone: descriptors (cma's pidfds, shm's
// kept connections, control connections) and goroutines return to what
// they were after the first source.
func TestShortLivedSourcesLeaveNothingBehind(t *testing.T) {
	const sources = 25
	parent := parentRuntime(t, runtimeConfig{Name: "long-lived"})
	transports := []string{"cma", "shm", ""}

	settled := func() bool { return parent.Stats().Peers == 0 }
	// Warm-up: whatever the runtime and its transports set up once (the
	// shm transport's listener stays; Go's own descriptors) is in the
	// baseline.
	shortLivedSource(t, parent, 1, false, transports...)
	require.Eventually(t, settled, 20*time.Second, 10*time.Millisecond, "the receiver notices its first source left")
	baseFDs, baseGoroutines := openFDs(t), runtime.NumGoroutine()

	for i := 0; i < sources; i++ {
		shortLivedSource(t, parent, 10+3*i, i%2 == 1, transports...)
	}
	// A killed source is noticed when its connection closes (at once, as
	// the kernel closes its sockets), a clean exit likewise.
	require.Eventually(t, settled, 20*time.Second, 10*time.Millisecond, "the receiver notices every source left")
	const slack = 4 // descriptors a concurrent Go runtime task may hold
	var fds, goroutines int
	ok := assert.Eventually(t, func() bool {
		fds, goroutines = openFDs(t), runtime.NumGoroutine()
		return fds <= baseFDs+slack && goroutines <= baseGoroutines+slack
	}, 10*time.Second, 20*time.Millisecond)
	if !ok {
		links := map[string]int{}
		entries, _ := os.ReadDir("/proc/self/fd")
		for _, e := range entries {
			l, _ := os.Readlink("/proc/self/fd/" + e.Name())
			if len(l) > 8 {
				l = l[:8]
			}
			links[l]++
		}
		t.Errorf("after %d sources: %d descriptors (baseline %d: %v), %d goroutines (baseline %d)",
			sources, fds, baseFDs, links, goroutines, baseGoroutines)
	}
	s := parent.Stats()
	assert.Equal(t, uint64(0), s.BorrowedObjects, "every borrowed object was released")
	assert.Equal(t, uint64(3*(sources+1)), s.TransfersCompleted)
}

// craftCMA re-encodes a ref (with a valid checksum, as anyone can) with
// other cma metadata.
func craftCMA(t *testing.T, b []byte, meta []byte) []byte {
	t.Helper()
	desc, token, err := engine.DecodeRef(b)
	require.NoError(t, err)
	m := map[string][]byte{}
	for k, v := range desc.Meta {
		m[k] = v
	}
	m["cma"] = meta
	return engine.EncodeRef(desc, m, token)
}

func cmaMeta(t *testing.T, b []byte) []byte {
	t.Helper()
	desc, _, err := engine.DecodeRef(b)
	require.NoError(t, err)
	require.NotEmpty(t, desc.Meta["cma"])
	return desc.Meta["cma"]
}

// fetchCrafted fetches a crafted ref and returns the target and the error.
func fetchCrafted(t *testing.T, rt *engine.Runtime, b []byte) ([]byte, error) {
	t.Helper()
	o := borrow(t, rt, b)
	defer o.ref.Release()
	t.Cleanup(func() { freeMem(o.bufs[0]) })
	return o.bufs[0], o.get(engine.FetchOptions{}, 30*time.Second)
}

func untouched(b []byte) bool {
	for _, v := range b {
		if v != 0 {
			return false
		}
	}
	return true
}

// Ref bytes are checksummed, not signed. A ref re-encoded with cma
// metadata of another process (a real rdt process that is not the owner),
// or with addresses the owner did not put for this object, is refused by
// name, and no byte of that memory reaches the target.
func TestCraftedCMARefsAreRefused(t *testing.T) {
	parent := parentRuntime(t, runtimeConfig{Name: "receiver"})
	owner := startChild(t, runtimeConfig{Name: "owner"})
	other := startChild(t, runtimeConfig{Name: "bystander"})
	const n = 4096
	secret := owner.put("cma", 50, n) // another object of the owner's
	victim := owner.put("cma", 51, n)
	elsewhere := other.put("", 52, n) // auto: its ref carries cma metadata too
	desc, _, err := engine.DecodeRef(victim)
	require.NoError(t, err)

	t.Run("another process", func(t *testing.T) {
		got, err := fetchCrafted(t, parent, craftCMA(t, victim, cmaMeta(t, elsewhere)))
		require.Error(t, err)
		assert.Equal(t, transport.ErrCorrupt, transport.StatusOf(err), "%v", err)
		assert.Contains(t, err.Error(), desc.ID.String())
		assert.Contains(t, err.Error(), "another process")
		assert.True(t, untouched(got), "no byte of the other process reached the target")
	})
	t.Run("range of another object", func(t *testing.T) {
		// cma metadata: a 37-byte header, then (address u64, size u64) per
		// tensor. Point the tensor at the owner's other object.
		meta := append([]byte(nil), cmaMeta(t, victim)...)
		copy(meta[37:45], cmaMeta(t, secret)[37:45])
		got, err := fetchCrafted(t, parent, craftCMA(t, victim, meta))
		require.Error(t, err)
		assert.Equal(t, transport.ErrCorrupt, transport.StatusOf(err), "%v", err)
		assert.Contains(t, err.Error(), desc.ID.String())
		assert.True(t, untouched(got), "no byte of the other object reached the target")
	})
	t.Run("whole metadata of another object", func(t *testing.T) {
		got, err := fetchCrafted(t, parent, craftCMA(t, victim, cmaMeta(t, secret)))
		assert.Equal(t, transport.ErrCorrupt, transport.StatusOf(err), "%v", err)
		assert.True(t, untouched(got))
	})
	// The genuine ref still reads the object.
	fetchAndCheck(t, parent, victim, 51, "")
}
