package peerpool

import (
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rdt-project/rdt/core/transport"
)

type key struct {
	peer transport.RuntimeID
	path string
}

// conn is a connection that records being closed.
type conn struct {
	name   string
	mu     sync.Mutex
	closed int
}

func (c *conn) Close() {
	c.mu.Lock()
	c.closed++
	c.mu.Unlock()
}

func (c *conn) closes() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closed
}

func newPool(max int, timeout time.Duration) *Pool[key, *conn] {
	return New(Config[key, *conn]{
		Max:         max,
		Close:       (*conn).Close,
		Peer:        func(k key) transport.RuntimeID { return k.peer },
		IdleTimeout: timeout,
	})
}

var (
	alice = transport.RuntimeID{1}
	bob   = transport.RuntimeID{2}
)

func TestTakeHandsOutTheLastPut(t *testing.T) {
	p := newPool(4, 0)
	k := key{alice, "a"}
	_, ok := p.Take(k)
	assert.False(t, ok, "an empty pool has nothing")
	first, second := &conn{name: "first"}, &conn{name: "second"}
	p.Put(k, first)
	p.Put(k, second)
	assert.Equal(t, []*conn{first, second}, p.Idle(k))
	c, ok := p.Take(k)
	require.True(t, ok)
	assert.Same(t, second, c, "the most recently used goes first")
	c, ok = p.Take(k)
	require.True(t, ok)
	assert.Same(t, first, c)
	_, ok = p.Take(k)
	assert.False(t, ok)
	assert.Zero(t, first.closes()+second.closes(), "taking closes nothing")
	_, ok = p.Take(key{alice, "b"})
	assert.False(t, ok, "keys do not share")
}

func TestPutBeyondTheBoundCloses(t *testing.T) {
	p := newPool(2, 0)
	k := key{alice, "a"}
	cs := []*conn{{}, {}, {}}
	for _, c := range cs {
		p.Put(k, c)
	}
	assert.Equal(t, 2, p.Len(k))
	assert.Equal(t, []int{0, 0, 1}, []int{cs[0].closes(), cs[1].closes(), cs[2].closes()})
	other := &conn{}
	p.Put(key{alice, "b"}, other)
	assert.Zero(t, other.closes(), "the bound is per key")
	assert.Equal(t, 3, p.Count())
	assert.Equal(t, 3, p.PeerLen(alice))
}

func TestDropClosesOneKey(t *testing.T) {
	p := newPool(4, 0)
	a, b := &conn{}, &conn{}
	p.Put(key{alice, "a"}, a)
	p.Put(key{alice, "b"}, b)
	p.Drop(key{alice, "a"})
	assert.Equal(t, 1, a.closes())
	assert.Zero(t, b.closes())
	assert.Equal(t, 1, p.Count())
}

func TestDropPeerClosesOnlyThatPeer(t *testing.T) {
	p := newPool(4, 0)
	a1, a2, b1 := &conn{}, &conn{}, &conn{}
	p.Put(key{alice, "a"}, a1)
	p.Put(key{alice, "b"}, a2)
	p.Put(key{bob, "a"}, b1)
	p.DropPeer(alice)
	assert.Equal(t, 1, a1.closes())
	assert.Equal(t, 1, a2.closes())
	assert.Zero(t, b1.closes())
	assert.Zero(t, p.PeerLen(alice))
	assert.Equal(t, 1, p.PeerLen(bob))
	p.Put(key{alice, "a"}, a1)
	assert.Equal(t, 1, p.PeerLen(alice), "a peer dropped may come back")
}

func TestCloseClosesAllAndWhatComesBack(t *testing.T) {
	p := newPool(4, time.Hour)
	a, b := &conn{}, &conn{}
	p.Put(key{alice, "a"}, a)
	p.Put(key{bob, "a"}, b)
	require.True(t, p.Reaping())
	p.Close()
	assert.Equal(t, 1, a.closes())
	assert.Equal(t, 1, b.closes())
	assert.Zero(t, p.Count())
	assert.False(t, p.Reaping(), "nothing scheduled after close")
	late := &conn{}
	p.Put(key{alice, "a"}, late)
	assert.Equal(t, 1, late.closes(), "a connection that comes back after close is closed")
	assert.Zero(t, p.Count())
}

func TestIdleConnectionsAreReaped(t *testing.T) {
	p := newPool(4, 50*time.Millisecond)
	k := key{alice, "a"}
	old := &conn{}
	p.Put(k, old)
	time.Sleep(30 * time.Millisecond)
	fresh := &conn{}
	p.Put(k, fresh)
	require.Eventually(t, func() bool { return old.closes() == 1 }, 5*time.Second, time.Millisecond)
	assert.Zero(t, fresh.closes(), "a connection younger than the timeout stays")
	require.Eventually(t, func() bool { return fresh.closes() == 1 }, 5*time.Second, time.Millisecond)
	assert.Zero(t, p.Count())
	require.Eventually(t, func() bool { return !p.Reaping() }, 5*time.Second, time.Millisecond, "nothing kept, nothing scheduled")
	p.Put(k, &conn{})
	assert.True(t, p.Reaping(), "a put schedules it again")
	p.Close()
}

func TestNoTimeoutNoReaper(t *testing.T) {
	p := newPool(4, 0)
	p.Put(key{alice, "a"}, &conn{})
	assert.False(t, p.Reaping())
}

func TestConcurrentUse(t *testing.T) {
	p := newPool(3, time.Millisecond)
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			k := key{transport.RuntimeID{byte(i % 2)}, "a"}
			for range 200 {
				c, ok := p.Take(k)
				if !ok {
					c = &conn{}
				}
				p.Put(k, c)
				if i == 0 {
					p.DropPeer(k.peer)
				}
			}
		}()
	}
	wg.Wait()
	p.Close()
	assert.Zero(t, p.Count())
}
