package transport

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// LogRecord is one log line held for a binding to take (rdt_log_take):
// what a logger would have written to stderr, in parts.
type LogRecord struct {
	Level   LogLevel
	Time    time.Time
	Name    string // the runtime's name
	Message string // the line after "rdt[name] level: "
}

// MaxCapturedLogs bounds the capture queue: a binding that stops taking
// lines costs at most this many; older ones are dropped and counted.
const MaxCapturedLogs = 4096

// The capture queue and the level override are the process's, like
// stderr itself: every runtime's lines go to the one place a binding
// drains, and a binding sets one level for the whole library.
var (
	captured      logCapture
	levelOverride atomic.Int32 // LogDefault: each logger's own level
)

type logCapture struct {
	on      atomic.Bool // read on every line; the rest under mu
	mu      sync.Mutex
	ready   chan struct{} // closed (and replaced) when lines arrive or capture stops
	queue   []LogRecord   // a ring of MaxCapturedLogs
	head    int
	n       int
	dropped uint64 // lines dropped since the last take
}

// SetLogCapture starts (true) or stops (false) holding log lines for
// TakeLogs instead of writing them to stderr. Stopping drops what is held
// and wakes every waiting TakeLogs. Loggers with an output of their own
// (LoggerTo) keep writing there.
func SetLogCapture(on bool) {
	c := &captured
	c.mu.Lock()
	defer c.mu.Unlock()
	if on == c.on.Load() {
		return
	}
	c.on.Store(on)
	c.queue, c.head, c.n, c.dropped = nil, 0, 0, 0
	if on {
		c.queue = make([]LogRecord, MaxCapturedLogs)
	}
	c.wakeLocked()
}

// SetLogLevelOverride sets the level of every logger of the process, now and
// later (LogDefault: each its own again). A logger made with LogOff stays
// silent: it was asked to be.
func SetLogLevelOverride(level LogLevel) error {
	if level < LogDefault || level > LogDebug {
		return Errorf(ErrInvalidArgument, "log level %d: want RDT_LOG_DEFAULT to RDT_LOG_DEBUG (0 to 5)", level)
	}
	levelOverride.Store(int32(level))
	return nil
}

// ErrNotCapturing is TakeLogs's answer while capture is off.
var ErrNotCapturing = Errorf(ErrClosed, "log lines are not being captured (rdt_log_capture)")

// TakeLogs moves up to len(out) held lines, oldest first, into out. It
// waits up to timeout (negative: forever) for the first; 0 lines is a
// timeout, not an error. When lines were dropped since the last take, the
// first record says how many. ErrNotCapturing when capture is off or stops
// while it waits.
func TakeLogs(out []LogRecord, timeout time.Duration) (int, error) {
	c := &captured
	var expired <-chan time.Time
	if timeout >= 0 {
		t := time.NewTimer(timeout)
		defer t.Stop()
		expired = t.C
	}
	for {
		c.mu.Lock()
		if !c.on.Load() {
			c.mu.Unlock()
			return 0, ErrNotCapturing
		}
		if c.n > 0 || c.dropped > 0 || len(out) == 0 {
			got := c.takeLocked(out)
			c.mu.Unlock()
			return got, nil
		}
		if c.ready == nil {
			c.ready = make(chan struct{})
		}
		ready := c.ready
		c.mu.Unlock()
		select {
		case <-ready:
		case <-expired:
			return 0, nil
		}
	}
}

func (c *logCapture) takeLocked(out []LogRecord) int {
	got := 0
	if c.dropped > 0 && len(out) > 0 {
		out[0] = LogRecord{Level: LogWarn, Time: time.Now(), Name: "rdt",
			Message: fmt.Sprintf("%d log lines were dropped: they came faster than they were taken (at most %d are held)", c.dropped, MaxCapturedLogs)}
		c.dropped = 0
		got = 1
	}
	for got < len(out) && c.n > 0 {
		out[got] = c.queue[c.head]
		c.queue[c.head] = LogRecord{}
		c.head = (c.head + 1) % len(c.queue)
		c.n--
		got++
	}
	return got
}

// hold queues a line; false when capture is off (the caller writes it).
func (c *logCapture) hold(r LogRecord) bool {
	if !c.on.Load() {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.on.Load() {
		return false
	}
	if c.n == len(c.queue) { // full: the oldest goes
		c.queue[c.head] = LogRecord{}
		c.head = (c.head + 1) % len(c.queue)
		c.n--
		c.dropped++
	}
	c.queue[(c.head+c.n)%len(c.queue)] = r
	c.n++
	c.wakeLocked()
	return true
}

func (c *logCapture) wakeLocked() {
	if c.ready != nil {
		close(c.ready)
		c.ready = nil
	}
}
