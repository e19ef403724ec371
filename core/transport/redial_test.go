package transport

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// dialError is a failed connect as net.Dialer returns it.
func dialError(errno syscall.Errno) error {
	return &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", errno)}
}

// refusedDial is a real dial to a port nothing listens on.
func refusedDial(t *testing.T) error {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	ln.Close()
	c, err := net.Dial("tcp", addr)
	if err == nil {
		c.Close()
		t.Skip("a port just closed accepted a connection")
	}
	return err
}

func TestTransientDialErrorsAreTheNetworksNotThePeers(t *testing.T) {
	for _, errno := range []syscall.Errno{syscall.EHOSTUNREACH, syscall.ENETUNREACH, syscall.EHOSTDOWN, syscall.ENETDOWN, syscall.ETIMEDOUT, syscall.EAGAIN} {
		assert.True(t, TransientDialError(dialError(errno)), "%v", errno)
		// Kept reachable through the errors that carry it.
		assert.True(t, TransientDialError(Errorf(ErrPeerUnavailable, "reaching %s: %w", "there", dialError(errno))), "%v", errno)
	}
	// A dial that timed out on its own: the link may drop packets for now.
	assert.True(t, TransientDialError(&net.OpError{Op: "dial", Net: "tcp", Err: os.ErrDeadlineExceeded}))

	// A refused connection means nothing listens: the runtime is gone.
	refused := refusedDial(t)
	assert.True(t, errors.Is(refused, syscall.ECONNREFUSED), "%v", refused)
	assert.False(t, TransientDialError(refused))
	assert.False(t, TransientDialError(dialError(syscall.ECONNRESET)))
	// Only what the dial returned counts: a cause quoted in text is not.
	assert.False(t, TransientDialError(Errorf(ErrPeerUnavailable, "handshake: %v", dialError(syscall.EHOSTUNREACH))))
	assert.False(t, TransientDialError(context.Canceled))
	assert.False(t, TransientDialError(Errorf(ErrPermissionDenied, "refused the token")))
	assert.False(t, TransientDialError(nil))
}

// failing is a dial that fails with err for its first n tries (every
// try when n < 0), then succeeds; tries counts them.
type failing struct {
	n, tries int
	err      error
}

func (f *failing) dial(context.Context) (string, error) {
	f.tries++
	if f.n < 0 || f.tries <= f.n {
		return "", f.err
	}
	return "conn", nil
}

func TestRedialTriesATransientFailureAgainAndLogsAtDebug(t *testing.T) {
	var out bytes.Buffer
	log := NewLoggerTo("rt", LogDebug, &out)
	f := &failing{n: 3, err: dialError(syscall.EHOSTUNREACH)}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := Redial(ctx, 0, log, "dialing there", f.dial)
	require.NoError(t, err)
	assert.Equal(t, "conn", c)
	assert.Equal(t, 4, f.tries)
	logged := out.String()
	assert.Equal(t, 4, bytes.Count(out.Bytes(), []byte(" debug: ")), logged)
	assert.Contains(t, logged, "dialing there: try 1 failed, trying again in ")
	assert.Contains(t, logged, "no route to host")
	assert.Contains(t, logged, "dialing there: connected on try 4")
	assert.NotContains(t, logged, "warn")
}

func TestRedialReturnsAnErrorThatIsNotTransientAtOnce(t *testing.T) {
	refused := Errorf(ErrPeerUnavailable, "reaching there: %w", refusedDial(t))
	f := &failing{n: -1, err: refused}
	_, err := Redial(context.Background(), time.Minute, nil, "dialing there", f.dial)
	assert.Same(t, refused, err)
	assert.Equal(t, 1, f.tries)

	// Also after transient failures: the last answer is the one that counts.
	tries := 0
	_, err = Redial(context.Background(), time.Minute, nil, "dialing there", func(context.Context) (string, error) {
		tries++
		if tries < 3 {
			return "", dialError(syscall.ENETUNREACH)
		}
		return "", refused
	})
	assert.Same(t, refused, err)
	assert.Equal(t, 3, tries)
}

func TestRedialKeepsTryingUntilTheDeadlineAndSaysWhatItTried(t *testing.T) {
	const within = 2500 * time.Millisecond
	cause := Errorf(ErrTimeout, "the caller's deadline passed")
	ctx, cancel := context.WithTimeoutCause(context.Background(), within, cause)
	defer cancel()
	deadline, _ := ctx.Deadline()
	f := &failing{n: -1, err: dialError(syscall.EHOSTUNREACH)}
	_, err := Redial(ctx, time.Hour, nil, "connecting to there", f.dial)
	returned := time.Now()
	require.Error(t, err)

	// Not before the deadline, and not a wait past it: a wait in progress
	// at the deadline could last up to redialMax.
	assert.False(t, returned.Before(deadline))
	assert.Less(t, returned.Sub(deadline), redialMax/2)
	// Backoff: far fewer tries than a busy loop, more than one.
	assert.Greater(t, f.tries, 3)
	assert.Less(t, f.tries, 20)

	assert.Equal(t, ErrTimeout, StatusOf(err))
	msg := err.Error()
	assert.Contains(t, msg, fmt.Sprintf("connecting to there: %d tries failed, the last: dial tcp: connect: no route to host", f.tries))
	assert.Contains(t, msg, "the caller's deadline passed")
}

func TestRedialWithoutADeadlineGivesUpAfterItsLimit(t *testing.T) {
	const limit = 400 * time.Millisecond
	f := &failing{n: -1, err: Errorf(ErrPeerUnavailable, "reaching there: %w", dialError(syscall.EHOSTUNREACH))}
	start := time.Now()
	_, err := Redial(context.Background(), limit, nil, "connecting to there", f.dial)
	// It stops once the next wait would end past the limit: never later.
	assert.Less(t, time.Since(start), limit)
	assert.Greater(t, f.tries, 1)
	assert.Equal(t, ErrPeerUnavailable, StatusOf(err))
	assert.Contains(t, err.Error(), fmt.Sprintf("connecting to there: %d tries failed, the last: reaching there: dial tcp: connect: no route to host", f.tries))
}

func TestRedialStopsWhenItsContextIsCancelled(t *testing.T) {
	closed := Errorf(ErrClosed, "runtime is destroyed")

	// During a wait between tries (or the try after it, whichever it hit).
	ctx, cancel := context.WithCancelCause(context.Background())
	failed := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		tries := 0
		_, err := Redial(ctx, time.Hour, nil, "connecting to there", func(ctx context.Context) (string, error) {
			if tries++; tries == 1 {
				close(failed)
				return "", dialError(syscall.EHOSTUNREACH)
			}
			<-ctx.Done()
			return "", ContextError(ctx, "connecting")
		})
		done <- err
	}()
	<-failed
	cancel(closed)
	err := <-done
	assert.Equal(t, ErrClosed, StatusOf(err))
	assert.Contains(t, err.Error(), "connecting to there: 1 try failed: dial tcp: connect: no route to host")

	// During a try: the try's own error (the cancellation) is not retried.
	ctx, cancel = context.WithCancelCause(context.Background())
	defer cancel(nil)
	tries := 0
	_, err = Redial(ctx, time.Hour, nil, "connecting to there", func(ctx context.Context) (string, error) {
		tries++
		if tries == 3 {
			cancel(closed)
			return "", ContextError(ctx, "connecting")
		}
		return "", dialError(syscall.ENETUNREACH)
	})
	assert.Equal(t, 3, tries)
	assert.Equal(t, ErrClosed, StatusOf(err))
	// The try cut short is not counted as failed: its cause is ctx's.
	assert.Contains(t, err.Error(), "connecting to there: 2 tries failed, the last: dial tcp: connect: network is unreachable")

	// A first try cut short is returned as it is: nothing was retried.
	ctx, cancel = context.WithCancelCause(context.Background())
	cancel(closed)
	first := ContextError(ctx, "connecting")
	_, err = Redial(ctx, time.Hour, nil, "connecting to there", func(context.Context) (string, error) { return "", first })
	assert.Same(t, first, err)
}
