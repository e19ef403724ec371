package transport

import (
	"context"
	"errors"
	"fmt"
)

// Status is an rdt status code; the values match rdt_status in rdt.h.
type Status int32

const (
	OK                  Status = 0
	ErrInvalidArgument  Status = -1
	ErrNotFound         Status = -2
	ErrAlreadyExists    Status = -3
	ErrTimeout          Status = -4
	ErrAborted          Status = -5
	ErrPeerUnavailable  Status = -6
	ErrCorrupt          Status = -7
	ErrUnsupported      Status = -8
	ErrPermissionDenied Status = -9
	ErrTransport        Status = -10
	ErrNoMemory         Status = -11
	ErrABIMismatch      Status = -12
	ErrForked           Status = -13
	ErrClosed           Status = -14
	ErrInternal         Status = -50
	ErrUser             Status = -100
)

var statusNames = map[Status]string{
	OK:                  "RDT_OK",
	ErrInvalidArgument:  "RDT_ERR_INVALID_ARGUMENT",
	ErrNotFound:         "RDT_ERR_NOT_FOUND",
	ErrAlreadyExists:    "RDT_ERR_ALREADY_EXISTS",
	ErrTimeout:          "RDT_ERR_TIMEOUT",
	ErrAborted:          "RDT_ERR_ABORTED",
	ErrPeerUnavailable:  "RDT_ERR_PEER_UNAVAILABLE",
	ErrCorrupt:          "RDT_ERR_CORRUPT",
	ErrUnsupported:      "RDT_ERR_UNSUPPORTED",
	ErrPermissionDenied: "RDT_ERR_PERMISSION_DENIED",
	ErrTransport:        "RDT_ERR_TRANSPORT",
	ErrNoMemory:         "RDT_ERR_NO_MEMORY",
	ErrABIMismatch:      "RDT_ERR_ABI_MISMATCH",
	ErrForked:           "RDT_ERR_FORKED",
	ErrClosed:           "RDT_ERR_CLOSED",
	ErrInternal:         "RDT_ERR_INTERNAL",
	ErrUser:             "RDT_ERR_USER",
}

// Known reports whether s is one of the codes rdt.h defines.
func (s Status) Known() bool {
	_, ok := statusNames[s]
	return ok
}

// String names the status as its C constant does.
func (s Status) String() string {
	if n, ok := statusNames[s]; ok {
		return n
	}
	if s < ErrUser {
		return "RDT_ERR_USER"
	}
	return fmt.Sprintf("RDT_ERR_UNKNOWN(%d)", int32(s))
}

// Error is an error with an rdt status. Every error the core returns to the
// C ABI is (or wraps) an *Error.
type Error struct {
	Status Status
	Msg    string
	cause  error
}

func (e *Error) Error() string { return e.Msg }
func (e *Error) Unwrap() error { return e.cause }

// RDTStatus implements StatusCarrier.
func (e *Error) RDTStatus() Status { return e.Status }

// StatusCarrier is an error that knows its rdt status: *Error, or a
// transport's own error type (a driver's failed call, say). StatusOf honours
// the outermost one in a chain, so a transport returns such errors as they
// are, with no converter of its own.
type StatusCarrier interface {
	error
	RDTStatus() Status
}

// Errorf makes an *Error with a formatted message. A %w verb keeps the
// wrapped error reachable with errors.Is/As. Address keys (runtime secrets)
// quoted in the message are hidden.
func Errorf(s Status, format string, args ...any) error {
	err := fmt.Errorf(format, args...)
	return &Error{Status: s, Msg: redactSecrets(err.Error()), cause: errors.Unwrap(err)}
}

// StatusOf maps any error to a status: the status of the outermost
// StatusCarrier it wraps, ErrTimeout/ErrAborted for context errors, else
// ErrInternal.
func StatusOf(err error) Status {
	if err == nil {
		return OK
	}
	var c StatusCarrier
	if errors.As(err, &c) {
		return c.RDTStatus()
	}
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return ErrTimeout
	case errors.Is(err, context.Canceled):
		return ErrAborted
	}
	return ErrInternal
}

// Wrap prefixes err's message with a context string and keeps its status.
func Wrap(err error, format string, args ...any) error {
	if err == nil {
		return nil
	}
	prefix := fmt.Sprintf(format, args...)
	return &Error{Status: StatusOf(err), Msg: redactSecrets(prefix + ": " + err.Error()), cause: err}
}

// ContextError is the error of a wait that ctx ended: the status-carrying
// error ctx was cancelled with (context.WithCancelCause), else ErrTimeout when its
// deadline passed and ErrAborted when it was cancelled.
func ContextError(ctx context.Context, format string, args ...any) error {
	what := fmt.Sprintf(format, args...)
	var c StatusCarrier
	if cause := context.Cause(ctx); errors.As(cause, &c) {
		return Wrap(cause, "%s", what)
	}
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return Errorf(ErrTimeout, "%s: the deadline passed", what)
	}
	return Errorf(ErrAborted, "%s: cancelled", what)
}
