package transport

import "strings"

// TransportAdvert is what a runtime tells peers about one of its transports.
type TransportAdvert struct {
	Name     string
	Devices  []DeviceType
	OneSided bool
}

// PeerInfo identifies a runtime to its peers.
type PeerInfo struct {
	RuntimeID  RuntimeID
	Name       string
	Address    string
	HostID     string
	Pid        int
	Transports []TransportAdvert
}

// SameHost reports whether two runtimes share a host (same boot, same
// process and mount namespaces), so that host-local transports apply.
func (p PeerInfo) SameHost(q PeerInfo) bool { return p.HostID != "" && p.HostID == q.HostID }

// Advert finds the peer's advertisement of a transport.
func (p PeerInfo) Advert(name string) (TransportAdvert, bool) {
	for _, a := range p.Transports {
		if a.Name == name {
			return a, true
		}
	}
	return TransportAdvert{}, false
}

// String names the peer for messages, without the secret its address may
// carry.
func (p PeerInfo) String() string {
	if p.Name != "" {
		return p.Name + "@" + RedactAddress(p.Address)
	}
	return RedactAddress(p.Address)
}

// tcpScheme starts the TCP part of a runtime address.
const tcpScheme = "tcp://"

// Addresses of runtimes that listen on TCP without a configured token carry
// the runtime's secret: tcp://<secret>@host:port. Whoever holds the address
// (it travels in refs) may connect; nobody else can. These helpers keep the
// secret out of what gets printed.

const redactedKey = "****"

// SplitTCPKey splits the part after tcp:// into the key and host:port.
func SplitTCPKey(s string) (key, hostport string) {
	if i := strings.LastIndexByte(s, '@'); i >= 0 {
		return s[:i], s[i+1:]
	}
	return "", s
}

// StripAddressKeys removes the keys from every TCP part of an address: what
// is left names the endpoints without granting access to them.
func StripAddressKeys(address string) string {
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
		key, hostport := SplitTCPKey(p[len(tcpScheme):])
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
