package transport

import (
	"fmt"
	"os"
	"sync"
	"time"
)

// Lines for stderr go through a bounded queue that one goroutine writes,
// so logging never blocks the caller: a control-plane reader or a lock
// holder that logs must not stop because stderr is a pipe nobody drains
// (a parent reading only stdout, a paused terminal). When the queue is
// full, new lines are dropped and counted, and the writer says how many
// once it catches up.

// MaxStderrBacklog bounds the lines waiting for stderr.
const MaxStderrBacklog = 4096

type stderrQueue struct {
	mu      sync.Mutex
	lines   []string
	dropped uint64
	wake    chan struct{} // holds a token while lines wait
	idle    chan struct{} // closed (and replaced) when the queue empties
	started bool
	write   func(string) // os.Stderr.WriteString; tests replace it
}

var toStderr = stderrQueue{
	wake:  make(chan struct{}, 1),
	idle:  make(chan struct{}),
	write: func(s string) { os.Stderr.WriteString(s) },
}

// push queues one line, or drops and counts it when MaxStderrBacklog wait.
func (q *stderrQueue) push(line string) {
	q.mu.Lock()
	if len(q.lines) >= MaxStderrBacklog {
		q.dropped++
		q.mu.Unlock()
		return
	}
	q.lines = append(q.lines, line)
	if !q.started {
		q.started = true
		go q.drain()
	}
	q.mu.Unlock()
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

// drain writes queued lines for the life of the process.
func (q *stderrQueue) drain() {
	var batch []string
	for range q.wake {
		for {
			q.mu.Lock()
			batch = append(batch[:0], q.lines...)
			clear(q.lines)
			q.lines = q.lines[:0]
			dropped := q.dropped
			q.dropped = 0
			if len(batch) == 0 && dropped == 0 {
				close(q.idle)
				q.idle = make(chan struct{})
				q.mu.Unlock()
				break
			}
			q.mu.Unlock()
			for _, line := range batch {
				q.write(line)
			}
			if dropped > 0 {
				q.write(fmt.Sprintf("%s rdt: %d log lines were dropped: stderr took them slower than they came (at most %d wait)\n",
					time.Now().Format("15:04:05.000000"), dropped, MaxStderrBacklog))
			}
			clear(batch)
		}
	}
}

// FlushStderrLogs waits up to timeout until every queued log line was
// written to stderr; it reports whether they all were. A runtime being
// destroyed calls it, so that a program's last lines are not lost when it
// exits right after.
func FlushStderrLogs(timeout time.Duration) bool {
	q := &toStderr
	q.mu.Lock()
	if len(q.lines) == 0 && q.dropped == 0 {
		q.mu.Unlock()
		return true
	}
	idle := q.idle
	q.mu.Unlock()
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-idle:
		return true
	case <-t.C:
		return false
	}
}
