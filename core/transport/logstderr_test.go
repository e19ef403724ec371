package transport

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"
)

// A stderr that nobody drains never blocks a logger: lines wait in the
// queue up to MaxStderrBacklog, the rest are dropped and counted, and once
// stderr moves again the writer says how many.
func TestStderrThatBlocksNeverBlocksTheLogger(t *testing.T) {
	stuck := make(chan struct{})
	var mu sync.Mutex
	var written []string
	q := &stderrQueue{wake: make(chan struct{}, 1), idle: make(chan struct{}), write: func(s string) {
		<-stuck
		mu.Lock()
		written = append(written, s)
		mu.Unlock()
	}}
	// At most a batch the writer took and a full queue are held.
	const lines = 3 * MaxStderrBacklog
	done := make(chan struct{})
	go func() {
		for i := 0; i < lines; i++ {
			q.push("line\n")
		}
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("push blocked on a stderr that does not drain")
	}
	close(stuck)
	// Every line is written or counted in a note (one per batch that
	// dropped some), and at least the queue's worth are written.
	deadline := time.Now().Add(30 * time.Second)
	for {
		mu.Lock()
		kept, dropped := 0, 0
		for _, line := range written {
			if i := strings.Index(line, "rdt: "); i >= 0 && strings.Contains(line, "were dropped") {
				var n int
				fmt.Sscanf(line[i+5:], "%d", &n)
				dropped += n
			} else {
				kept++
			}
		}
		mu.Unlock()
		if kept+dropped == lines {
			if kept < MaxStderrBacklog || dropped == 0 {
				t.Fatalf("%d lines written and %d dropped; want at least %d written and some dropped", kept, dropped, MaxStderrBacklog)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d lines written and %d dropped of %d", kept, dropped, lines)
		}
		time.Sleep(time.Millisecond)
	}
}
