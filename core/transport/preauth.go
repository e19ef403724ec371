package transport

import (
	"container/list"
	"net"
	"strconv"
	"sync"
	"time"
)

// Connections in their handshake. Until its handshake ends a connection
// has proved nothing, so whoever reaches a port can open as many as it
// likes. A listener therefore keeps the state of such a connection small
// (a goroutine and the one handshake frame being read) and bounds how many
// it holds, without ever making a connection wait for room: a pool of
// slots that newcomers queue for lets a few idle connections hold off
// every honest peer (64 slots held for 10 s each kept one waiting 100 s
// behind 640 idle connections).
//
// Instead a newcomer is always let in, and when that puts its source
// address past MaxPreAuthPerSource, or the listener past MaxPreAuth, the
// connection that has waited longest of its address (past the listener's
// cap: of the address holding the most) is closed. So connections from
// one address only ever push out each other while other addresses hold no
// fewer, and an honest peer is pushed out only if MaxPreAuthPerSource
// newer connections from its own address arrive during its handshake,
// which takes two round trips: a flood from the same address (on loopback,
// everyone's) must open hundreds of connections per round trip to keep it
// out. PreAuthTimeout bounds each handshake.
const (
	PreAuthTimeout      = 5 * time.Second
	MaxPreAuth          = 1024
	MaxPreAuthPerSource = 512
)

// PreAuth is the set of a listener's connections in their handshake.
type PreAuth struct {
	total, perSource int

	mu      sync.Mutex
	n       int
	seq     uint64
	sources map[string]*list.List // of *Pending, oldest first
	closed  bool
}

// Pending is one connection of a PreAuth.
type Pending struct {
	g      *PreAuth
	c      net.Conn
	source string
	seq    uint64
	el     *list.Element // nil once done or pushed out
	pushed bool
}

// NewPreAuth makes the set of a listener's connections in their handshake,
// holding at most total of them and perSource from one source address.
func NewPreAuth(total, perSource int) *PreAuth {
	return &PreAuth{total: total, perSource: perSource, sources: map[string]*list.List{}}
}

// Admit records c, just accepted, as in its handshake, closing the
// connection that makes room for it if one must go (see above).
func (g *PreAuth) Admit(c net.Conn) *Pending {
	p := &Pending{g: g, c: c, source: sourceOf(c)}
	g.mu.Lock()
	if g.closed {
		g.mu.Unlock()
		c.Close()
		return p
	}
	var victim *Pending
	l := g.sources[p.source]
	switch {
	case l != nil && l.Len() >= g.perSource:
		victim = l.Front().Value.(*Pending)
	case g.n >= g.total:
		victim = g.heaviestLocked()
	}
	if victim != nil {
		g.removeLocked(victim)
		victim.pushed = true
	}
	if l = g.sources[p.source]; l == nil {
		l = list.New()
		g.sources[p.source] = l
	}
	g.seq++
	p.seq = g.seq
	p.el = l.PushBack(p)
	g.n++
	g.mu.Unlock()
	if victim != nil {
		victim.c.Close()
	}
	return p
}

// heaviestLocked is the oldest connection of the source holding the most
// (of those, the one that waited longest).
func (g *PreAuth) heaviestLocked() *Pending {
	var best *Pending
	most := 0
	for _, l := range g.sources {
		front := l.Front().Value.(*Pending)
		if l.Len() > most || l.Len() == most && front.seq < best.seq {
			best, most = front, l.Len()
		}
	}
	return best
}

func (g *PreAuth) removeLocked(p *Pending) {
	l := g.sources[p.source]
	l.Remove(p.el)
	if l.Len() == 0 {
		delete(g.sources, p.source)
	}
	p.el = nil
	g.n--
}

// Done ends the connection's handshake, so that it no longer counts. It
// reports false when the connection was pushed out (and closed) first:
// the caller drops it.
func (p *Pending) Done() bool {
	g := p.g
	g.mu.Lock()
	defer g.mu.Unlock()
	if p.el != nil {
		g.removeLocked(p)
	}
	return !p.pushed
}

// PushedOut is the error of a connection that Done reported pushed out.
func PushedOut() error {
	return Errorf(ErrNoMemory, "closed in its handshake to make room for newer connections (at most %d from one address and %d in all are in their handshake at once)",
		MaxPreAuthPerSource, MaxPreAuth)
}

// Close closes every connection still in its handshake, and any admitted
// later: the listener is closing (they are not pushed out: Done says
// true, and what reads them fails).
func (g *PreAuth) Close() {
	g.mu.Lock()
	g.closed = true
	var all []*Pending
	for _, l := range g.sources {
		for e := l.Front(); e != nil; e = e.Next() {
			all = append(all, e.Value.(*Pending))
		}
	}
	for _, p := range all {
		g.removeLocked(p)
	}
	g.mu.Unlock()
	for _, p := range all {
		p.c.Close()
	}
}

// sourceOf names where a connection comes from, for per-source caps: its
// IPv4 address, or its IPv6 /64 (what one host is usually given), or on a
// Unix socket the process at the other end.
func sourceOf(c net.Conn) string {
	if a, ok := c.RemoteAddr().(*net.TCPAddr); ok {
		if ip := a.IP.To4(); ip != nil {
			return ip.String()
		}
		return a.IP.Mask(net.CIDRMask(64, 128)).String()
	}
	if pid, err := UnixPeerPid(c); err == nil {
		return "pid " + strconv.Itoa(pid)
	}
	return ""
}
