package control

import (
	"context"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rdt-project/rdt/core/transport"
)

// Every asynchronous borrow is answered exactly once, whatever the
// connection does meanwhile: by the owner, by the connection's end, or by
// the caller's deadline. (An answer twice would count a refused borrow
// twice in the borrower's books.)
func TestSocketsBorrowAnsweredOnce(t *testing.T) {
	var twice, never atomic.Int64
	for round := 0; round < 200; round++ {
		_, owner := listenStub(t, "owner")
		_, borrower := listenStub(t, "borrower")
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		peer, err := borrower.Connect(ctx, owner.Address())
		require.NoError(t, err)
		var wg sync.WaitGroup
		for g := 0; g < 4; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; i < 300; i++ {
					var calls atomic.Int32
					answered := make(chan struct{})
					peer.BorrowAsync(ctx, transport.RandomID(), 1, func(error) {
						if calls.Add(1) == 1 {
							close(answered)
						} else {
							twice.Add(1)
						}
					})
					select {
					case <-answered:
					case <-time.After(10 * time.Second):
						never.Add(1)
					}
				}
			}()
		}
		time.Sleep(time.Duration(round%5) * time.Millisecond)
		owner.Close()
		wg.Wait()
		cancel()
	}
	assert.Zero(t, twice.Load(), "borrows answered twice")
	assert.Zero(t, never.Load(), "borrows never answered")
}

// A peer that claims another runtime's address in its handshake is not
// taken for that runtime: the borrower still reaches the real owner there.
func TestSocketsClaimedAddressIsNotCached(t *testing.T) {
	owner, ownerEP := listenStub(t, "owner")
	_, borrowerEP := listenStub(t, "borrower")
	obj := owner.put()
	ownerID := owner.Identity().RuntimeID

	borrowerPath, _, _ := endpoints(t, borrowerEP)
	c, err := net.Dial("unix", borrowerPath)
	require.NoError(t, err)
	defer c.Close()
	impostor := newRawPeer()
	impostor.info.Address = ownerEP.Address()
	_, err = rawHandshake(c, impostor, "")
	require.NoError(t, err, "a peer may connect as itself")

	peer, err := borrowAt(borrowerEP, ownerEP.Address(), obj)
	require.NoError(t, err, "the owner's address reaches the owner, not the peer that claimed it")
	defer peer.Unborrow(obj, 1)
	assert.Equal(t, ownerID, peer.Info().RuntimeID)
	eventually(t, func() bool { return owner.Borrows() == 1 }, "the borrow reaches the owner")
	assert.True(t, AddressNames(ownerEP.Address(), ownerID))
	assert.False(t, AddressNames(ownerEP.Address(), impostor.info.RuntimeID))
}

// An owner that is gone is named once in the error, with why each of its
// endpoints did not answer: its socket removed, or left behind by a
// process that died without removing it.
func TestSocketsUnreachableNamesTheAddressOnce(t *testing.T) {
	_, ep := listenStub(t, "reader")
	dir := t.TempDir()
	gone := UnixScheme + filepath.Join(dir, "gone.sock")
	_, err := connectTo(ep, gone)
	assert.Equal(t, transport.ErrPeerUnavailable, transport.StatusOf(err))
	assert.Contains(t, err.Error(), gone+": not on this host or gone")
	assert.Equal(t, 1, strings.Count(err.Error(), "gone.sock"), err.Error())

	path := filepath.Join(dir, "dead.sock")
	l, err := net.Listen("unix", path)
	require.NoError(t, err)
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	require.NoError(t, l.Close()) // the file stays; nobody listens
	_, err = connectTo(ep, UnixScheme+path)
	assert.Equal(t, transport.ErrPeerUnavailable, transport.StatusOf(err))
	assert.Contains(t, err.Error(), "connection refused")
	assert.Equal(t, 1, strings.Count(err.Error(), "dead.sock"), err.Error())
}
