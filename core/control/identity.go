package control

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"math/big"
	"slices"

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
	if weakPoint(key) {
		return transport.Errorf(transport.ErrPermissionDenied, "the peer's key for runtime %s is of small order or not canonically encoded: it proves nothing", claimed)
	}
	if !verify(key, sig, transcript) {
		return transport.Errorf(transport.ErrPermissionDenied, "the peer did not prove that it holds the key of runtime %s", claimed)
	}
	return nil
}

// verify checks an identity signature, refusing what crypto/ed25519
// accepts but proves nothing: a key of small order (the identity point,
// with R the identity and S = 0, verifies for every message) or one
// encoded with y >= p, and a signature whose R is such a point. (Go
// already refuses S >= L and compares R as the canonical encoding.)
func verify(key, sig, transcript []byte) bool {
	return len(key) == ed25519.PublicKeySize && len(sig) == ed25519.SignatureSize &&
		!weakPoint(key) && !weakPoint(sig[:32]) && ed25519.Verify(ed25519.PublicKey(key), transcript, sig)
}

// smallOrderY are the y coordinates, little endian, of the eight points
// of small order on edwards25519: the identity (y = 1), the point of order
// 2 (y = -1), those of order 4 (y = 0) and those of order 8 (y = ±y8).
// Their x differ only in sign, which an encoding keeps in its top bit, so
// comparing y covers all eight. (The test checks with X25519 that these
// are the points of small order.)
var smallOrderY = func() [][32]byte {
	p := new(big.Int).Sub(new(big.Int).Lsh(big.NewInt(1), 255), big.NewInt(19))
	y8, _ := new(big.Int).SetString("2707385501144840649318225287225658788936804267575313519463743609750303402022", 10)
	var out [][32]byte
	for _, y := range []*big.Int{big.NewInt(0), big.NewInt(1), new(big.Int).Sub(p, big.NewInt(1)), y8, new(big.Int).Sub(p, y8)} {
		var b [32]byte
		y.FillBytes(b[:])
		slices.Reverse(b[:])
		out = append(out, b)
	}
	return out
}()

// weakPoint reports whether b, an encoded point, is of small order or
// not canonical: its y (the low 255 bits) is p = 2^255-19 or more.
// Checking y against the list is simpler than decoding the point and
// multiplying it by the cofactor, and as exact: y determines a point up
// to the sign of x, and both points with a given y have the same order.
func weakPoint(b []byte) bool {
	var y [32]byte
	copy(y[:], b)
	y[31] &= 0x7f
	// y >= p = 0x7fff...ffed: bytes 1 to 31 as in p, byte 0 0xed or more.
	if y[31] == 0x7f && y[0] >= 0xed && bytes.Count(y[1:31], []byte{0xff}) == 30 {
		return true
	}
	return slices.Contains(smallOrderY, y)
}
