package transport

import "runtime/debug"

// Protect runs fn and turns a panic in it into an ErrInternal error that
// names what was being done; the panic's stack goes to log (which may be
// nil). Work the engine runs on goroutines of its own, and every call
// into a transport, goes through it: a panic there would otherwise end
// the process, or (on a caller's goroutine) leave a transfer that never
// ends and a caller that waits for it forever.
func Protect(log *Logger, what string, fn func() error) error {
	return ProtectOf(log, what, "", fn)
}

// ProtectOf is Protect for work of transport name, which the error names
// after what ("waiting for a request of transport", "tcp"): the two are
// joined only after a panic, not on every call.
func ProtectOf(log *Logger, what, name string, fn func() error) (err error) {
	defer func() {
		if r := recover(); r != nil {
			if name != "" {
				what += " " + name
			}
			err = Panicked(log, what, r)
		}
	}()
	return fn()
}

// Panicked is the error of a panic r recovered while doing what, logged
// with its stack.
func Panicked(log *Logger, what string, r any) error {
	log.Errorf("internal error while %s: %v\n%s", what, r, debug.Stack())
	return Errorf(ErrInternal, "internal error while %s: %v (please report it; the stack was logged)", what, r)
}
