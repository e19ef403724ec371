package control

import (
	"bufio"
	"crypto/ed25519"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rdt-project/rdt/core/transport"
	"github.com/rdt-project/rdt/core/transport/transporttest"
)

func TestSocketsTCPTokens(t *testing.T) {
	withTCP := func(token string) func(*ListenConfig) {
		return func(c *ListenConfig) { c.ListenTCP = "127.0.0.1:0"; c.AuthToken = token }
	}
	owner, ownerEP := listenStub(t, "owner", withTCP("sesame"))
	require.Contains(t, ownerEP.Address(), ",tcp://127.0.0.1:")
	tcpOnly := ownerEP.Address()[strings.Index(ownerEP.Address(), "tcp://"):] // as a peer on another host would reach it
	obj := owner.put()

	_, good := listenStub(t, "good", withTCP("sesame"))
	peer, err := borrowAt(good, tcpOnly, obj)
	require.NoError(t, err)
	peer.Unborrow(obj, 1)

	_, bad := listenStub(t, "bad", withTCP("guess"))
	_, err = borrowAt(bad, tcpOnly, obj)
	assert.Equal(t, transport.ErrPermissionDenied, transport.StatusOf(err), "%v", err)
	assert.Contains(t, err.Error(), "token")
	_, none := listenStub(t, "none")
	_, err = borrowAt(none, tcpOnly, obj)
	assert.Equal(t, transport.ErrPermissionDenied, transport.StatusOf(err))

	// Non-loopback TCP without a token is refused at creation.
	_, cfg := stubConfig(t, "open", func(c *ListenConfig) { c.ListenTCP = "0.0.0.0:0" })
	_, err = Sockets{}.Listen(cfg)
	assert.Equal(t, transport.ErrPermissionDenied, transport.StatusOf(err))
}

func TestWrongTokenFloodLogsAFewLines(t *testing.T) {
	var logged transporttest.LogBuffer
	_, ep := listenStub(t, "guarded", func(c *ListenConfig) {
		c.ListenTCP, c.AuthToken, c.Log = "127.0.0.1:0", "right", transport.NewLoggerTo("guarded", transport.LogWarn, &logged)
	})
	_, tcpAddr, _ := endpoints(t, ep)
	const attempts = 1000
	for i := 0; i < attempts; i++ {
		c, err := net.Dial("tcp", tcpAddr)
		require.NoError(t, err)
		_, err = rawHandshake(c, newRawPeer(), "wrong")
		require.Equal(t, transport.ErrPermissionDenied, transport.StatusOf(err), "attempt %d: %v", i, err)
		c.Close()
	}
	ep.Close() // writes what the log still holds
	lines := strings.Split(strings.TrimSpace(logged.String()), "\n")
	t.Logf("%d lines:\n%s", len(lines), logged.String())
	assert.LessOrEqual(t, len(lines), 3, "1000 refusals in a few lines")
	total := 0
	for _, line := range lines {
		var n int
		if strings.Contains(line, "refused a connection from") {
			total++
			assert.Contains(t, line, "failed to prove the auth token")
		} else if i := strings.Index(line, "refused "); i >= 0 {
			_, err := fmt.Sscanf(line[i:], "refused %d more connections since", &n)
			require.NoError(t, err, "a summary line: %q", line)
			assert.Contains(t, line, "failed to prove the auth token", "it names the last refusal")
			total += n
		} else {
			t.Errorf("unexpected log line %q", line)
		}
	}
	assert.Equal(t, attempts, total, "every refusal is counted")
}

func TestSocketsClaimedIdentityMustBeProven(t *testing.T) {
	s := newTwoStubs(t, "borrower")
	owner, ownerEP, borrower, obj := s.owner, s.ownerEP, s.other, s.obj
	peer := s.borrow(t)
	defer peer.Unborrow(obj, 1)
	eventually(t, func() bool { return owner.Borrows() == 1 }, "the borrow arrives")
	unixPath, _, _ := endpoints(t, ownerEP)
	dial := func() net.Conn {
		c, err := net.Dial("unix", unixPath)
		require.NoError(t, err)
		t.Cleanup(func() { c.Close() })
		return c
	}
	borrowerID := borrower.Identity().RuntimeID

	// Claiming the borrower's id with one's own key.
	impostor := newRawPeer()
	impostor.info.RuntimeID = borrowerID
	_, err := rawHandshake(dial(), impostor, "")
	require.Equal(t, transport.ErrPermissionDenied, transport.StatusOf(err), "%v", err)
	assert.Contains(t, err.Error(), "does not match the runtime id")

	// Claiming it with the borrower's public key, which is no secret, but
	// without its private key.
	impostor = newRawPeer()
	impostor.info.RuntimeID = borrowerID
	c := dial()
	_, err = func() (*bufio.Reader, error) {
		nonce := transport.NewNonce()
		c.Write((&Message{Kind: KindHello, Nonce: nonce}).Encode())
		rd := bufio.NewReader(c)
		ch, err := Expect(rd, KindChallenge)
		require.NoError(t, err)
		c.Write((&Message{Kind: KindAuth, Proof: transport.AuthProof("", ProofClient, ch.Nonce), Peer: impostor.info,
			Key: borrower.key.Public().(ed25519.PublicKey), Sig: ed25519.Sign(impostor.key, IdentityTranscript(SignClient, nonce, ch.Nonce, ch.Key))}).Encode())
		_, err = Expect(rd, KindWelcome)
		return rd, err
	}()
	require.Equal(t, transport.ErrPermissionDenied, transport.StatusOf(err), "%v", err)
	assert.Contains(t, err.Error(), "did not prove")

	// As itself it gets in, but returning the borrower's borrow counts
	// against its own (none).
	c = dial()
	rd, err := rawHandshake(c, newRawPeer(), "")
	require.NoError(t, err)
	_, err = c.Write((&Message{Kind: KindUnborrow, Object: obj, Count: 1}).Encode())
	require.NoError(t, err)
	_, err = c.Write((&Message{Kind: KindLease, ID: 1, Object: obj}).Encode())
	require.NoError(t, err)
	_, err = Expect(rd, KindResponse) // requests are served in order: the unborrow was seen
	require.NoError(t, err)
	assert.Equal(t, uint64(1), owner.Borrows(), "the borrower's borrow stands")

	// On the Unix socket the claimed pid must be the connecting process.
	liar := newRawPeer()
	liar.info.HostID = owner.Identity().HostID
	liar.info.Pid = os.Getpid() + 1
	_, err = rawHandshake(dial(), liar, "")
	require.Equal(t, transport.ErrPermissionDenied, transport.StatusOf(err), "%v", err)
	assert.Contains(t, err.Error(), fmt.Sprintf("claims pid %d", os.Getpid()+1))
	honest := newRawPeer()
	honest.info.HostID = owner.Identity().HostID
	_, err = rawHandshake(dial(), honest, "")
	assert.NoError(t, err, "the true pid is accepted")
}

// A server that claims a runtime id it cannot prove is refused by the
// dialing side too.
func TestSocketsServerIdentityIsChecked(t *testing.T) {
	owner, _ := listenStub(t, "owner")
	obj := owner.put()

	// A fake owner on its own socket: it signs with its key and claims the
	// real owner's id.
	path := filepath.Join(t.TempDir(), "fake.sock")
	ln, err := net.Listen("unix", path)
	require.NoError(t, err)
	defer ln.Close()
	fake := newRawPeer()
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		rd := bufio.NewReader(c)
		hello, err := Expect(rd, KindHello)
		if err != nil {
			return
		}
		nonce := transport.NewNonce()
		c.Write((&Message{Kind: KindChallenge, Nonce: nonce, Proof: transport.AuthProof("", ProofServer, hello.Nonce),
			Key: fake.key.Public().(ed25519.PublicKey), Sig: ed25519.Sign(fake.key, IdentityTranscript(SignServer, hello.Nonce, nonce, nil))}).Encode())
		if _, err := Expect(rd, KindAuth); err != nil {
			return
		}
		claimed := owner.Identity()
		claimed.Pid = os.Getpid()
		c.Write((&Message{Kind: KindWelcome, Peer: claimed}).Encode())
		io.Copy(io.Discard, c)
	}()
	_, borrower := listenStub(t, "borrower")
	_, err = borrowAt(borrower, UnixScheme+path, obj)
	require.Equal(t, transport.ErrPermissionDenied, transport.StatusOf(err), "%v", err)
	assert.Contains(t, err.Error(), "holds the key of")
	assert.Zero(t, owner.Borrows())
}
