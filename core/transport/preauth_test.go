package transport

import (
	"io"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Past the cap of its address a newcomer pushes out that address's oldest
// connection; past the listener's, the oldest of the address holding the
// most, never one of an address holding fewer.
func TestPreAuthPushesOutTheOldestOfTheBusiestSource(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	g := NewPreAuth(4, 3)
	type conn struct {
		client net.Conn
		p      *Pending
	}
	admit := func(from string) conn {
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}}
		c, err := d.Dial("tcp", ln.Addr().String())
		require.NoError(t, err)
		t.Cleanup(func() { c.Close() })
		s, err := ln.Accept()
		require.NoError(t, err)
		t.Cleanup(func() { s.Close() })
		return conn{c, g.Admit(s)}
	}
	closed := func(c conn) bool {
		c.client.SetReadDeadline(time.Now().Add(5 * time.Second))
		_, err := c.client.Read(make([]byte, 1))
		return err == io.EOF
	}

	a1, a2, a3 := admit("127.0.0.1"), admit("127.0.0.1"), admit("127.0.0.1")
	a4 := admit("127.0.0.1") // past 3 from one address
	assert.False(t, a1.p.Done(), "the oldest of the address is pushed out")
	assert.True(t, closed(a1), "and closed")
	b1 := admit("127.0.0.2")
	b2 := admit("127.0.0.2") // past 4 in all
	assert.False(t, a2.p.Done(), "the oldest of the address holding the most goes")
	assert.True(t, closed(a2))
	for _, c := range []conn{a3, a4, b1, b2} {
		assert.True(t, c.p.Done(), "the others stay")
	}
	assert.True(t, a3.p.Done(), "Done again says the same")

	c1 := admit("127.0.0.2")
	g.Close()
	assert.True(t, closed(c1), "closing the listener closes what is in its handshake")
	assert.True(t, c1.p.Done(), "without calling it pushed out")
	c2 := admit("127.0.0.2")
	assert.True(t, closed(c2), "and what comes later")
}
