package control

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"

	"github.com/rdt-project/rdt/core/transport"
)

// A runtime's identity is a key pair it makes at creation: its RuntimeID is
// the first 16 bytes of the SHA-256 of the public key, so a peer that claims
// an id in a handshake proves it by signing the other side's nonce with the
// matching private key. Holding the token lets a peer in; only the key lets
// it act as a given runtime (return that runtime's borrows, say).

const (
	// Labels of the identity signatures, one per direction, so a signature
	// made as a server cannot be replayed as a client's.
	SignServer = "rdt-control-server-identity"
	SignClient = "rdt-control-client-identity"
)

// NewIdentityKey makes a runtime's key pair and the id derived from it.
func NewIdentityKey() (ed25519.PrivateKey, transport.RuntimeID) {
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		panic("rdt: no randomness: " + err.Error())
	}
	return priv, runtimeIDOf(pub)
}

// runtimeIDOf is the id a public key stands for.
func runtimeIDOf(pub []byte) transport.RuntimeID {
	var id transport.RuntimeID
	sum := sha256.Sum256(pub)
	copy(id[:], sum[:len(id)])
	return id
}

// IdentityTranscript is what one side of a handshake signs: the direction's
// label, both nonces (fresh on both sides, so a signature is good for one
// connection only) and, for the client, the server's public key (so a
// server cannot relay a client's signature to a third runtime and act as
// that client there).
func IdentityTranscript(label string, clientNonce, serverNonce, serverKey []byte) []byte {
	b := make([]byte, 0, len(label)+1+len(clientNonce)+len(serverNonce)+len(serverKey))
	b = append(b, label...)
	b = append(b, 0)
	b = append(b, clientNonce...)
	b = append(b, serverNonce...)
	return append(b, serverKey...)
}

// checkIdentity verifies that whoever sent key and sig holds the key of the
// runtime id it claims.
func checkIdentity(claimed transport.RuntimeID, key, sig, transcript []byte) error {
	if len(key) != ed25519.PublicKeySize || runtimeIDOf(key) != claimed {
		return transport.Errorf(transport.ErrPermissionDenied, "the peer's key does not match the runtime id %s it claims", claimed)
	}
	if len(sig) != ed25519.SignatureSize || !ed25519.Verify(ed25519.PublicKey(key), transcript, sig) {
		return transport.Errorf(transport.ErrPermissionDenied, "the peer did not prove that it holds the key of runtime %s", claimed)
	}
	return nil
}
