package control

import (
	"bufio"
	"crypto/ed25519"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/rdt-project/rdt/core/transport"
)

const maxUnixPath = 107

// refusalLogInterval is how often refused connections are summarized in
// the log after the first one of a burst is written.
var refusalLogInterval = 10 * time.Second

// Listen implements Network.
func (Sockets) Listen(cfg ListenConfig) (Endpoint, error) {
	ep := &sockEndpoint{
		cfg: cfg, id: cfg.Service.Identity().RuntimeID,
		conns: map[*sconn]struct{}{}, byAddr: map[string]*sconn{},
		perPeer: map[transport.RuntimeID]int{}, dialing: map[string]*dialCall{},
		stop:     make(chan struct{}),
		refusals: transport.NewFloodLog(cfg.Log, transport.LogWarn, refusalLogInterval, "control plane: refused a connection", "control plane: refused %d more connections since %s"),
	}
	if ep.cfg.PeerTimeout <= 0 {
		ep.cfg.PeerTimeout = transport.DefaultPeerTimeout
	}
	if len(cfg.Key) != ed25519.PrivateKeySize || runtimeIDOf(cfg.Key.Public().(ed25519.PublicKey)) != ep.id {
		return nil, transport.Errorf(transport.ErrInvalidArgument, "the control plane needs the runtime's identity key")
	}
	ep.pub = cfg.Key.Public().(ed25519.PublicKey)
	// Without a shared token, TCP peers prove the runtime's own secret,
	// which they learn only from the address inside its refs.
	ep.tcpToken = cfg.AuthToken
	if ep.tcpToken == "" {
		ep.tcpToken = cfg.Secret
	}
	if cfg.ListenTCP != "" && ep.tcpToken == "" {
		return nil, transport.Errorf(transport.ErrInvalidArgument, "listening on TCP needs an auth token or the runtime's secret")
	}
	if err := EnsurePrivateDir(cfg.SocketDir); err != nil {
		return nil, err
	}
	ep.unixPath = filepath.Join(cfg.SocketDir, socketName(ep.id))
	if len(ep.unixPath) > maxUnixPath {
		return nil, transport.Errorf(transport.ErrInvalidArgument, "socket path %s is longer than the %d bytes Unix sockets allow; choose a shorter socket_dir", ep.unixPath, maxUnixPath)
	}
	os.Remove(ep.unixPath)
	ln, err := net.Listen("unix", ep.unixPath)
	if err != nil {
		return nil, transport.Errorf(transport.ErrPermissionDenied, "listening on %s: %v", ep.unixPath, err)
	}
	os.Chmod(ep.unixPath, 0o600)
	ep.unixLn = ln
	ep.address = UnixScheme + ep.unixPath
	if cfg.ListenTCP != "" {
		host, _, err := net.SplitHostPort(cfg.ListenTCP)
		if err != nil {
			ln.Close()
			return nil, transport.Errorf(transport.ErrInvalidArgument, "listen address %q: want host:port", cfg.ListenTCP)
		}
		if cfg.AuthToken == "" && !IsLoopback(host) {
			ln.Close()
			return nil, transport.Errorf(transport.ErrPermissionDenied, "listening on %s needs an auth token (RDT_AUTH_TOKEN or the auth_token option); without one rdt listens on loopback only", cfg.ListenTCP)
		}
		tl, err := net.Listen("tcp", cfg.ListenTCP)
		if err != nil {
			ln.Close()
			return nil, transport.Errorf(transport.ErrPermissionDenied, "listening on %s: %v", cfg.ListenTCP, err)
		}
		ep.tcpLn = tl
		advertise := host
		if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
			advertise = cfg.AdvertiseHost
		}
		port := tl.Addr().(*net.TCPAddr).Port
		key := ""
		if cfg.AuthToken == "" {
			key = cfg.Secret + "@"
		}
		ep.address += "," + TCPScheme + key + net.JoinHostPort(advertise, fmt.Sprint(port))
	}
	ep.wg.Add(2)
	go ep.acceptLoop(ep.unixLn, false)
	go ep.heartbeat()
	if ep.tcpLn != nil {
		ep.wg.Add(1)
		go ep.acceptLoop(ep.tcpLn, true)
	}
	go sweepStaleSockets(cfg.SocketDir, ep.unixPath)
	return ep, nil
}

// sweepStaleSockets removes socket files of runtimes that exited without
// cleaning up (killed processes): old files nobody accepts connections on.
// A socket the kernel lists as listening is left alone without connecting
// to it, so live runtimes are not disturbed; any other old file is probed,
// and removed when connecting is refused.
func sweepStaleSockets(dir, own string) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	var listening map[string]bool // read once, when a file is old enough to matter
	for _, e := range entries {
		path := filepath.Join(dir, e.Name())
		if path == own || !strings.HasSuffix(e.Name(), ".sock") || e.Type()&os.ModeSocket == 0 {
			continue
		}
		info, err := e.Info()
		if err != nil || time.Since(info.ModTime()) < 30*time.Second {
			continue // may be a socket being set up right now
		}
		if listening == nil {
			listening = listeningUnixSockets()
		}
		if listening[path] {
			continue
		}
		c, err := net.DialTimeout("unix", path, 100*time.Millisecond)
		if err == nil {
			c.Close()
			continue
		}
		if errors.Is(err, syscall.ECONNREFUSED) {
			os.Remove(path)
		}
	}
}

// soAcceptConn is __SO_ACCEPTCON in /proc/net/unix's Flags: a listening socket.
const soAcceptConn = 1 << 16

// listeningUnixSockets is the set of paths of listening Unix sockets in
// this network namespace, from /proc/net/unix; empty when it cannot be
// read. Sockets of other namespaces are missing from it.
func listeningUnixSockets() map[string]bool {
	out := map[string]bool{}
	f, err := os.Open("/proc/net/unix")
	if err != nil {
		return out
	}
	defer f.Close()
	lines := bufio.NewScanner(f)
	lines.Scan() // Num RefCount Protocol Flags Type St Inode Path
	for lines.Scan() {
		fields := strings.Fields(lines.Text())
		if len(fields) < 8 {
			continue // unbound
		}
		flags, err := strconv.ParseUint(fields[3], 16, 32)
		if err == nil && flags&soAcceptConn != 0 {
			out[strings.Join(fields[7:], " ")] = true
		}
	}
	return out
}

// acceptLoop accepts connections for their handshakes, never waiting for
// room: each costs a goroutine and the handshake frame it reads, and the
// listener's transport.PreAuth bounds how many it holds (see there).
func (ep *sockEndpoint) acceptLoop(ln net.Listener, isTCP bool) {
	defer ep.wg.Done()
	pending := transport.NewPreAuth(transport.MaxPreAuth, transport.MaxPreAuthPerSource)
	defer pending.Close()
	for {
		c, err := ln.Accept()
		if err != nil {
			select {
			case <-ep.stop:
				return
			default:
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			if errors.Is(err, net.ErrClosed) {
				return
			}
			ep.cfg.Log.Warnf("control plane: accept: %v", err)
			time.Sleep(10 * time.Millisecond)
			continue
		}
		p := pending.Admit(c)
		ep.wg.Add(1)
		go func() {
			defer ep.wg.Done()
			if err := ep.serverHandshake(c, isTCP, p); err != nil {
				if errors.Is(err, io.EOF) {
					// Closed between frames without a word: a runtime
					// checking that this socket is alive (sweepStaleSockets)
					// or a peer that gave up. Nothing was refused.
					ep.cfg.Log.Debugf("control plane: a connection from %s closed before the handshake ended", remoteName(c))
				} else {
					ep.refusals.Event(fmt.Sprintf("from %s: %v", remoteName(c), err))
				}
				c.Close()
			}
		}()
	}
}

// remoteName names the other end of a connection for the log: its address
// on TCP, its process on a Unix socket.
func remoteName(c net.Conn) string {
	if _, ok := c.(*net.UnixConn); ok {
		if pid, err := transport.UnixPeerPid(c); err == nil {
			return fmt.Sprintf("pid %d on the Unix socket", pid)
		}
		return "the Unix socket"
	}
	return c.RemoteAddr().String()
}

// IsLoopback tells whether host names this machine only, the one place
// TCP may listen without an auth token.
func IsLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
