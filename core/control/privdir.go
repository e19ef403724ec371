package control

import (
	"os"
	"syscall"

	"github.com/rdt-project/rdt/core/transport"
)

// EnsurePrivateDir makes dir (mode 0700) or checks that an existing one is
// a directory owned by this user that nobody else can enter.
func EnsurePrivateDir(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return transport.Errorf(transport.ErrPermissionDenied, "socket directory %s: %v", dir, err)
	}
	fi, err := os.Lstat(dir)
	if err != nil {
		return transport.Errorf(transport.ErrPermissionDenied, "socket directory %s: %v", dir, err)
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !fi.IsDir() || !ok || int(st.Uid) != os.Getuid() {
		return transport.Errorf(transport.ErrPermissionDenied, "socket directory %s is not a directory owned by uid %d", dir, os.Getuid())
	}
	if fi.Mode().Perm()&0o077 != 0 {
		if err := os.Chmod(dir, 0o700); err != nil {
			return transport.Errorf(transport.ErrPermissionDenied, "socket directory %s is open to other users and cannot be fixed: %v", dir, err)
		}
	}
	return nil
}
