package core

import (
	"crypto/hmac"
	"crypto/sha256"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"time"
)

// resolveHosts settles where TCP listeners bind and what peers dial, and
// makes the private socket directory.
func (rt *Runtime) resolveHosts() error {
	o := &rt.opts
	if o.BindHost == "" && o.ListenTCP != "" {
		// Transports' data listeners follow the control plane's TCP host.
		host, _, err := net.SplitHostPort(o.ListenTCP)
		if err != nil {
			return Errorf(ErrInvalidArgument, "listen address %q: want host:port", o.ListenTCP)
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
	if o.AuthToken == "" && !isLoopback(o.BindHost) {
		return Errorf(ErrPermissionDenied, "binding TCP to %s needs an auth token (RDT_AUTH_TOKEN or the auth_token option); without one rdt binds loopback only", o.BindHost)
	}
	if o.AdvertiseHost == "" {
		o.AdvertiseHost = o.BindHost
		if ip := net.ParseIP(o.BindHost); ip != nil && ip.IsUnspecified() {
			h, err := os.Hostname()
			if err != nil {
				return Errorf(ErrInvalidArgument, "cannot name this host for peers (set advertise_host): %v", err)
			}
			o.AdvertiseHost = h
		}
	}
	if o.SocketDir == "" {
		dir, err := DefaultSocketDir()
		if err != nil {
			return err
		}
		o.SocketDir = dir
	}
	return nil
}

func isLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// DefaultSocketDir is $XDG_RUNTIME_DIR/rdt, or <tmp>/rdt-<uid>, created
// with mode 0700 and checked to belong to this user.
func DefaultSocketDir() (string, error) {
	base := os.Getenv("XDG_RUNTIME_DIR")
	var dir string
	if base != "" {
		dir = filepath.Join(base, "rdt")
	} else {
		dir = filepath.Join(os.TempDir(), fmt.Sprintf("rdt-%d", os.Getuid()))
	}
	return dir, EnsurePrivateDir(dir)
}

// EnsurePrivateDir makes dir (mode 0700) or checks that an existing one is
// a directory owned by this user that nobody else can enter.
func EnsurePrivateDir(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return Errorf(ErrPermissionDenied, "socket directory %s: %v", dir, err)
	}
	fi, err := os.Lstat(dir)
	if err != nil {
		return Errorf(ErrPermissionDenied, "socket directory %s: %v", dir, err)
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !fi.IsDir() || !ok || int(st.Uid) != os.Getuid() {
		return Errorf(ErrPermissionDenied, "socket directory %s is not a directory owned by uid %d", dir, os.Getuid())
	}
	if fi.Mode().Perm()&0o077 != 0 {
		if err := os.Chmod(dir, 0o700); err != nil {
			return Errorf(ErrPermissionDenied, "socket directory %s is open to other users and cannot be fixed: %v", dir, err)
		}
	}
	return nil
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

// AuthProof is the response to a challenge: HMAC-SHA256 keyed with the
// shared token over a purpose label and the challenger's nonce. Both ends of
// a TCP endpoint (control plane or data plane) prove the token this way
// without sending it.
func AuthProof(token, purpose string, nonce []byte) []byte {
	m := hmac.New(sha256.New, []byte(token))
	m.Write([]byte(purpose))
	m.Write([]byte{0})
	m.Write(nonce)
	return m.Sum(nil)
}

// CheckAuthProof compares a proof in constant time.
func CheckAuthProof(token, purpose string, nonce, proof []byte) bool {
	return hmac.Equal(AuthProof(token, purpose, nonce), proof)
}

// NewNonce returns 32 random bytes for a challenge.
func NewNonce() []byte {
	a, b := randomID(), randomID()
	return append(a[:], b[:]...)
}
