package transport

import (
	"net"
	"testing"
	"time"
)

func TestWaitReadable(t *testing.T) {
	a, b, err := unixPair(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	defer b.Close()
	start := time.Now()
	if WaitReadable(a, 20*time.Millisecond) {
		t.Fatal("readable with nothing sent")
	}
	if waited := time.Since(start); waited < 15*time.Millisecond {
		t.Fatalf("returned after %v, before the wait passed", waited)
	}
	b.Write([]byte("x"))
	if !WaitReadable(a, time.Second) {
		t.Fatal("not readable after a byte was sent")
	}
	// A shutdown wakes a waiter at once (what a closing server relies on).
	a.Read(make([]byte, 1))
	done := make(chan bool)
	go func() { done <- WaitReadable(a, 10*time.Second) }()
	time.Sleep(20 * time.Millisecond)
	a.CloseRead()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("a shutdown did not wake the waiter")
	}
}

func unixPair(dir string) (*net.UnixConn, *net.UnixConn, error) {
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: dir + "/s", Net: "unix"})
	if err != nil {
		return nil, nil, err
	}
	defer ln.Close()
	b, err := net.DialUnix("unix", nil, ln.Addr().(*net.UnixAddr))
	if err != nil {
		return nil, nil, err
	}
	a, err := ln.AcceptUnix()
	if err != nil {
		b.Close()
		return nil, nil, err
	}
	return a, b, nil
}
