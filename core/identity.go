package core

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"strings"
)

// A runtime's identity is a key pair it makes at creation: its RuntimeID is
// the first 16 bytes of the SHA-256 of the public key, so a peer that claims
// an id in a handshake proves it by signing the other side's nonce with the
// matching private key. Holding the token lets a peer in; only the key lets
// it act as a given runtime (return that runtime's borrows, say).

const (
	// Labels of the identity signatures, one per direction, so a signature
	// made as a server cannot be replayed as a client's.
	signServer = "rdt-control-server-identity"
	signClient = "rdt-control-client-identity"
)

// newIdentityKey makes a runtime's key pair and the id derived from it.
func newIdentityKey() (ed25519.PrivateKey, RuntimeID) {
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		panic("rdt: no randomness: " + err.Error())
	}
	return priv, runtimeIDOf(pub)
}

// runtimeIDOf is the id a public key stands for.
func runtimeIDOf(pub []byte) RuntimeID {
	var id RuntimeID
	sum := sha256.Sum256(pub)
	copy(id[:], sum[:len(id)])
	return id
}

// identityTranscript is what one side of a handshake signs: the direction's
// label, both nonces (fresh on both sides, so a signature is good for one
// connection only) and, for the client, the server's public key (so a
// server cannot relay a client's signature to a third runtime and act as
// that client there).
func identityTranscript(label string, clientNonce, serverNonce, serverKey []byte) []byte {
	b := make([]byte, 0, len(label)+1+len(clientNonce)+len(serverNonce)+len(serverKey))
	b = append(b, label...)
	b = append(b, 0)
	b = append(b, clientNonce...)
	b = append(b, serverNonce...)
	return append(b, serverKey...)
}

// checkIdentity verifies that whoever sent key and sig holds the key of the
// runtime id it claims.
func checkIdentity(claimed RuntimeID, key, sig, transcript []byte) error {
	if len(key) != ed25519.PublicKeySize || runtimeIDOf(key) != claimed {
		return Errorf(ErrPermissionDenied, "the peer's key does not match the runtime id %s it claims", claimed)
	}
	if len(sig) != ed25519.SignatureSize || !ed25519.Verify(ed25519.PublicKey(key), transcript, sig) {
		return Errorf(ErrPermissionDenied, "the peer did not prove that it holds the key of runtime %s", claimed)
	}
	return nil
}

// Addresses of runtimes that listen on TCP without a configured token carry
// the runtime's secret: tcp://<secret>@host:port. Whoever holds the address
// (it travels in refs) may connect; nobody else can. These helpers keep the
// secret out of what gets printed.

const redactedKey = "****"

// splitTCPKey splits the part after tcp:// into the key and host:port.
func splitTCPKey(s string) (key, hostport string) {
	if i := strings.LastIndexByte(s, '@'); i >= 0 {
		return s[:i], s[i+1:]
	}
	return "", s
}

// stripAddressKeys removes the keys from every TCP part of an address: what
// is left names the endpoints without granting access to them.
func stripAddressKeys(address string) string {
	return rewriteTCPKeys(address, "")
}

// RedactAddress hides the keys of an address's TCP parts, for log lines and
// error messages.
func RedactAddress(address string) string {
	return rewriteTCPKeys(address, redactedKey)
}

func rewriteTCPKeys(address, with string) string {
	if !strings.Contains(address, "@") {
		return address
	}
	parts := strings.Split(address, ",")
	for i, p := range parts {
		if !strings.HasPrefix(p, tcpScheme) {
			continue
		}
		key, hostport := splitTCPKey(p[len(tcpScheme):])
		if key == "" {
			continue
		}
		if with == "" {
			parts[i] = tcpScheme + hostport
		} else {
			parts[i] = tcpScheme + with + "@" + hostport
		}
	}
	return strings.Join(parts, ",")
}

// redactSecrets hides every address key found in free text (a message that
// quotes an address somewhere inside): the run after each "tcp://" up to a
// separator loses what precedes its last '@'.
func redactSecrets(s string) string {
	if !strings.Contains(s, tcpScheme) || !strings.Contains(s, "@") {
		return s
	}
	var b strings.Builder
	for {
		i := strings.Index(s, tcpScheme)
		if i < 0 {
			b.WriteString(s)
			return b.String()
		}
		b.WriteString(s[:i+len(tcpScheme)])
		s = s[i+len(tcpScheme):]
		end := strings.IndexAny(s, ", \t\n\r;\"'()[]<>")
		if end < 0 {
			end = len(s)
		}
		run := s[:end] // a bracketed IPv6 host ends the run after its key

		if at := strings.LastIndexByte(run, '@'); at >= 0 {
			b.WriteString(redactedKey)
			s = s[at:]
			continue
		}
		b.WriteString(run)
		s = s[end:]
	}
}
