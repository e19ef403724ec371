package transport

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

// capture turns capture on for one test and off after it; the queue is the
// process's, so these tests do not run in parallel.
func capture(t *testing.T) {
	t.Helper()
	SetLogCapture(true)
	t.Cleanup(func() {
		SetLogCapture(false)
		SetLogLevelOverride(LogDefault)
	})
}

func TestCapturedLinesAreTakenInsteadOfWritten(t *testing.T) {
	capture(t)
	l := NewLogger("rt-a", LogInfo).Named("transport shm")
	l.Infof("one %d", 1)
	l.Debugf("below the level")
	l.Warnf("secret tcp://abcdef0123456789@127.0.0.1:1 here")
	out := make([]LogRecord, 8)
	n, err := TakeLogs(out, 0)
	if err != nil || n != 2 {
		t.Fatalf("took %d, %v; want 2 lines", n, err)
	}
	if out[0].Level != LogInfo || out[0].Name != "rt-a" || out[0].Message != "transport shm: one 1" {
		t.Fatalf("first record %+v", out[0])
	}
	if out[1].Level != LogWarn || strings.Contains(out[1].Message, "abcdef0123456789") {
		t.Fatalf("second record %+v: want a warning with the secret hidden", out[1])
	}
	if time.Since(out[0].Time) > time.Minute {
		t.Fatalf("record time %v", out[0].Time)
	}
}

func TestLoggerWithItsOwnOutputIsNotCaptured(t *testing.T) {
	capture(t)
	var b bytes.Buffer
	NewLoggerTo("rt-b", LogWarn, &b).Warnf("to the buffer")
	if !strings.Contains(b.String(), "to the buffer") {
		t.Fatalf("buffer has %q", b.String())
	}
	if n, _ := TakeLogs(make([]LogRecord, 1), 0); n != 0 {
		t.Fatalf("took %d lines; want none", n)
	}
}

func TestTakeWaitsForALineOrItsTimeout(t *testing.T) {
	capture(t)
	out := make([]LogRecord, 4)
	start := time.Now()
	if n, err := TakeLogs(out, 50*time.Millisecond); n != 0 || err != nil {
		t.Fatalf("empty queue: %d, %v", n, err)
	}
	if time.Since(start) < 40*time.Millisecond {
		t.Fatal("returned before the timeout")
	}
	go func() {
		time.Sleep(20 * time.Millisecond)
		NewLogger("rt-c", LogWarn).Errorf("late")
	}()
	n, err := TakeLogs(out, 10*time.Second)
	if err != nil || n != 1 || out[0].Message != "late" || out[0].Level != LogError {
		t.Fatalf("took %d, %v, %+v", n, err, out[0])
	}
}

func TestStoppingCaptureWakesAWaiter(t *testing.T) {
	SetLogCapture(true)
	defer SetLogCapture(false)
	done := make(chan error, 1)
	go func() {
		_, err := TakeLogs(make([]LogRecord, 1), -1)
		done <- err
	}()
	time.Sleep(20 * time.Millisecond)
	SetLogCapture(false)
	select {
	case err := <-done:
		if StatusOf(err) != ErrClosed {
			t.Fatalf("waiter got %v; want CLOSED", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the waiter was not woken")
	}
	if _, err := TakeLogs(make([]LogRecord, 1), 0); StatusOf(err) != ErrClosed {
		t.Fatalf("take while off: %v", err)
	}
}

func TestAFullQueueDropsTheOldestAndSaysHowMany(t *testing.T) {
	capture(t)
	l := NewLogger("rt-d", LogWarn)
	for i := 0; i < MaxCapturedLogs+10; i++ {
		l.Warnf("line %d", i)
	}
	out := make([]LogRecord, 3)
	n, err := TakeLogs(out, 0)
	if err != nil || n != 3 {
		t.Fatalf("took %d, %v", n, err)
	}
	if !strings.Contains(out[0].Message, "10 log lines were dropped") {
		t.Fatalf("first record %q", out[0].Message)
	}
	if out[1].Message != "line 10" || out[2].Message != "line 11" {
		t.Fatalf("oldest kept lines %q, %q; want line 10, line 11", out[1].Message, out[2].Message)
	}
}

func TestLevelOverrideAppliesToEveryLoggerButSilentOnes(t *testing.T) {
	capture(t)
	warn := NewLogger("rt-e", LogWarn)
	off := NewLogger("rt-f", LogOff)
	if warn.Enabled(LogDebug) {
		t.Fatal("debug enabled before the override")
	}
	if err := SetLogLevelOverride(LogDebug); err != nil {
		t.Fatal(err)
	}
	if !warn.Enabled(LogDebug) || !warn.Named("x").Enabled(LogDebug) {
		t.Fatal("the override did not reach an existing logger")
	}
	if off.Enabled(LogError) {
		t.Fatal("a logger made silent logs under the override")
	}
	SetLogLevelOverride(LogError)
	if warn.Enabled(LogWarn) || !warn.Enabled(LogError) {
		t.Fatal("the override does not lower the level")
	}
	SetLogLevelOverride(LogDefault)
	if !warn.Enabled(LogWarn) || warn.Enabled(LogInfo) {
		t.Fatal("LogDefault did not restore the logger's own level")
	}
	for _, bad := range []LogLevel{-1, LogDebug + 1} {
		if StatusOf(SetLogLevelOverride(bad)) != ErrInvalidArgument {
			t.Fatalf("level %d accepted", bad)
		}
	}
}
