package engine

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/rdt-project/rdt/core/control"
	"github.com/rdt-project/rdt/core/transport"
)

// The Host each built-in transport gets, and where its endpoints bind.

// transportHost is the Host a built-in transport gets: the runtime's
// identity, context and settings, what its TCP and Unix endpoints need,
// its objects to serve and writes to land, and a logger that names the
// transport (named), so transports never name themselves.
type transportHost struct {
	me       *identity
	log      *transport.Logger
	ctx      context.Context // the runtime's
	settings transport.Settings
	store    *store // objects served (PinObject) and written into (WriteInto)

	authToken     string // Options.AuthToken
	secret        string // made with the runtime (see Host.RuntimeSecret)
	bindHost      string // resolved by resolveHosts
	advertiseHost string
	socketDir     string
	peerTimeout   time.Duration
}

var _ transport.Host = transportHost{}

// named is h with a logger that names transport name.
func (h transportHost) named(name string) transportHost {
	h.log = h.log.Named("transport " + name)
	return h
}

// Identity implements Host.
func (h transportHost) Identity() transport.PeerInfo { return h.me.info() }

// Log implements Host.
func (h transportHost) Log() *transport.Logger { return h.log }

// Context implements Host.
func (h transportHost) Context() context.Context { return h.ctx }

// PinObject implements Host.
func (h transportHost) PinObject(id transport.ObjectID) ([]transport.Tensor, func(), error) {
	o, err := h.store.pin(id)
	if err != nil {
		return nil, nil, transport.Errorf(transport.ErrNotFound, "object %s is not held by runtime %s", id, h.me.name)
	}
	if o.write != nil {
		h.store.unpin(o)
		return nil, nil, transport.Errorf(transport.ErrPermissionDenied, "object %s is exposed for writing: it is not served", id)
	}
	return o.tensors, sync.OnceFunc(func() { h.store.unpin(o) }), nil
}

// WriteInto implements Host.
func (h transportHost) WriteInto(obj transport.ObjectID, writeID uint64) ([]transport.Tensor, []transport.Piece, func(), error) {
	o := h.store.object(obj)
	if o == nil || o.write == nil {
		return nil, nil, nil, transport.Errorf(transport.ErrNotFound, "object %s is not exposed for writing here", obj)
	}
	w, release, err := o.write.into(writeID)
	if err != nil {
		return nil, nil, nil, err
	}
	return o.tensors, w.pieces, sync.OnceFunc(release), nil
}

// AuthToken implements Host.
func (h transportHost) AuthToken() string { return h.authToken }

// RuntimeSecret implements Host.
func (h transportHost) RuntimeSecret() string { return h.secret }

// BindHost implements Host.
func (h transportHost) BindHost() string { return h.bindHost }

// AdvertiseHost implements Host.
func (h transportHost) AdvertiseHost() string { return h.advertiseHost }

// SocketDir implements Host.
func (h transportHost) SocketDir() string { return h.socketDir }

// PeerTimeout implements Host.
func (h transportHost) PeerTimeout() time.Duration { return h.peerTimeout }

// Settings implements Host: the transports' tunables read from the
// environment when the runtime was created.
func (h transportHost) Settings() transport.Settings { return h.settings }

// resolveHosts settles where TCP listeners bind and what peers dial, and
// makes the private socket directory (under env's runtime directory).
func resolveHosts(o *Options, env Environment) error {
	if o.BindHost == "" && o.ListenTCP != "" {
		// Transports' data listeners follow the control plane's TCP host.
		host, _, err := net.SplitHostPort(o.ListenTCP)
		if err != nil {
			return transport.Errorf(transport.ErrInvalidArgument, "listen address %q: want host:port", o.ListenTCP)
		}
		if host == "" {
			host = "0.0.0.0"
		}
		o.BindHost = host
	}
	if o.BindHost == "" {
		// Without a TCP control plane no other host can reach us anyway.
		o.BindHost = "127.0.0.1"
	}
	if o.AuthToken == "" && !control.IsLoopback(o.BindHost) {
		return transport.Errorf(transport.ErrPermissionDenied, "binding TCP to %s needs an auth token (RDT_AUTH_TOKEN or the auth_token option); without one rdt binds loopback only", o.BindHost)
	}
	if o.AdvertiseHost == "" {
		o.AdvertiseHost = o.BindHost
		if ip := net.ParseIP(o.BindHost); ip != nil && ip.IsUnspecified() {
			h, err := os.Hostname()
			if err != nil {
				return transport.Errorf(transport.ErrInvalidArgument, "cannot name this host for peers (set advertise_host): %v", err)
			}
			o.AdvertiseHost = h
		}
	}
	if o.SocketDir == "" {
		dir, err := defaultSocketDir(env.RuntimeDir)
		if err != nil {
			return err
		}
		o.SocketDir = dir
	}
	return nil
}

// defaultSocketDir is <runtimeDir>/rdt ($XDG_RUNTIME_DIR), or
// <tmp>/rdt-<uid> without one, created with mode 0700 and checked to
// belong to this user.
func defaultSocketDir(base string) (string, error) {
	var dir string
	if base != "" {
		dir = filepath.Join(base, "rdt")
	} else {
		dir = filepath.Join(os.TempDir(), fmt.Sprintf("rdt-%d", os.Getuid()))
	}
	return dir, control.EnsurePrivateDir(dir)
}
