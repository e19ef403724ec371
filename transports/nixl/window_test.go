package nixl

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// The posting window follows the measured rate: two chunks before anything
// landed, then what windowTime moves, never under a chunk (so every
// transfer makes progress) nor over maxWindow.
func TestWindowFollowsTheRate(t *testing.T) {
	r := &request{started: time.Now().Add(-time.Second), progress: make(chan struct{}, 1)}
	assert.Equal(t, uint64(2*chunkSize), r.window(), "nothing landed yet")

	r.landed.Store(12_500_000) // 100 Mbit/s for a second
	assert.Equal(t, uint64(chunkSize), r.window(), "a slow link keeps one chunk in flight")

	r.landed.Store(1_250_000_000) // 10 Gbit/s
	w := r.window()
	assert.Greater(t, w, uint64(4*chunkSize))
	assert.InDelta(t, 125_000_000, float64(w), 2_000_000, "100 ms at 10 Gbit/s")

	r.landed.Store(50_000_000_000) // 400 Gbit/s
	assert.Equal(t, uint64(maxWindow), r.window())
}

// roomFor lets a first chunk through at once, holds a chunk that does not
// fit until a poll says bytes landed, and gives up at an abort.
func TestRoomForWaitsForLandedBytes(t *testing.T) {
	r := &request{started: time.Now(), progress: make(chan struct{}, 1)}
	assert.True(t, r.roomFor(0, chunkSize), "nothing in flight")
	assert.True(t, r.roomFor(chunkSize, chunkSize), "two chunks fit before anything landed")

	got := make(chan bool, 1)
	go func() { got <- r.roomFor(2*chunkSize, chunkSize) }()
	select {
	case <-got:
		t.Fatal("a third chunk was let through with two in flight")
	case <-time.After(50 * time.Millisecond):
	}
	r.landed.Store(2 * chunkSize) // both landed, as poll records it
	r.progress <- struct{}{}
	select {
	case ok := <-got:
		assert.True(t, ok)
	case <-time.After(10 * time.Second):
		t.Fatal("landed bytes did not make room")
	}

	go func() { got <- r.roomFor(2*chunkSize+maxWindow, chunkSize) }() // a full window in flight
	r.aborted.Store(true)
	select {
	case ok := <-got:
		assert.False(t, ok, "aborted while waiting")
	case <-time.After(10 * time.Second):
		t.Fatal("an abort did not end the wait")
	}
}

// A posted request that failed (poll says so) stops a poster waiting for
// room: the transfer has failed, and Release waits for the poster.
func TestRoomForStopsWhenARequestFailed(t *testing.T) {
	r := &request{started: time.Now(), progress: make(chan struct{}, 1)}
	got := make(chan bool, 1)
	go func() { got <- r.roomFor(maxWindow, chunkSize) }() // a full window in flight
	select {
	case <-got:
		t.Fatal("a chunk was let through with a full window in flight")
	case <-time.After(20 * time.Millisecond):
	}
	r.stopped.Store(true) // as poll does when a request fails
	r.progress <- struct{}{}
	select {
	case ok := <-got:
		assert.False(t, ok)
	case <-time.After(10 * time.Second):
		t.Fatal("a failed request did not stop the poster")
	}
}
