package engine

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/rdt-project/rdt/core/control"
	"github.com/rdt-project/rdt/core/transport"
)

// resolveHosts settles where TCP listeners bind and what peers dial, and
// makes the private socket directory.
func (rt *Runtime) resolveHosts() error {
	o := &rt.opts
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
		dir, err := defaultSocketDir(rt.env.RuntimeDir)
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

// AuthToken implements Host.
func (rt *Runtime) AuthToken() string { return rt.opts.AuthToken }

// RuntimeSecret implements Host.
func (rt *Runtime) RuntimeSecret() string { return rt.secret }

// BindHost implements Host.
func (rt *Runtime) BindHost() string { return rt.opts.BindHost }

// AdvertiseHost implements Host.
func (rt *Runtime) AdvertiseHost() string { return rt.opts.AdvertiseHost }

// SocketDir implements Host.
func (rt *Runtime) SocketDir() string { return rt.opts.SocketDir }

// PeerTimeout implements Host.
func (rt *Runtime) PeerTimeout() time.Duration { return rt.opts.PeerTimeout }

// Settings are the transports' tunables read from the environment when
// the runtime was created.
func (rt *Runtime) Settings() transport.Settings { return rt.env.Settings }
