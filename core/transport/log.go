package transport

import (
	"fmt"
	"io"
	"strings"
	"sync"
	"time"
)

// LogLevel orders log messages; the values match RDT_LOG_* in rdt.h.
type LogLevel int32

const (
	LogDefault LogLevel = 0
	LogOff     LogLevel = 1
	LogError   LogLevel = 2
	LogWarn    LogLevel = 3
	LogInfo    LogLevel = 4
	LogDebug   LogLevel = 5
)

var levelNames = map[LogLevel]string{LogError: "error", LogWarn: "warn", LogInfo: "info", LogDebug: "debug"}

// ParseLogLevel reads the RDT_LOG syntax: off, error, warn, info or debug.
func ParseLogLevel(s string) (LogLevel, bool) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "off", "none", "0":
		return LogOff, true
	case "error":
		return LogError, true
	case "warn", "warning":
		return LogWarn, true
	case "info":
		return LogInfo, true
	case "debug", "trace":
		return LogDebug, true
	}
	return LogDefault, false
}

// Logger writes leveled lines to stderr (through a queue that never blocks
// the caller, logstderr.go), prefixed with the runtime name, or holds them
// for a binding to take while capture is on (logcapture.go). A logger with
// an output of its own (NewLoggerTo, Go callers only) writes to it
// directly, one line at a time.
type Logger struct {
	name   string
	level  LogLevel
	out    io.Writer // nil: stderr
	prefix string    // starts every message ("transport shm: ")
}

var outMu sync.Mutex // one line at a time to an output of a logger's own

// NewLogger makes a logger; LogDefault means warn (a runtime resolves
// RDT_LOG before it makes its logger).
func NewLogger(name string, level LogLevel) *Logger {
	return NewLoggerTo(name, level, nil)
}

// NewLoggerTo makes a logger that writes to out (nil: stderr).
func NewLoggerTo(name string, level LogLevel, out io.Writer) *Logger {
	if level == LogDefault {
		level = LogWarn
	}
	return &Logger{name: name, level: level, out: out}
}

// Named is a logger that writes like l, every message after "what: ". The
// engine gives each transport one naming it ("transport shm"), so that a
// transport's lines name it once without the transport naming itself.
func (l *Logger) Named(what string) *Logger {
	if l == nil {
		return nil
	}
	named := *l
	named.prefix = l.prefix + what + ": "
	return &named
}

// Enabled reports whether messages at level l are written: up to the
// process's override (SetLogLevelOverride) where one is set, else up to the
// logger's own level.
func (l *Logger) Enabled(level LogLevel) bool {
	if l == nil || level == LogOff || l.level == LogOff {
		return false
	}
	max := l.level
	if o := LogLevel(levelOverride.Load()); o != LogDefault {
		max = o
	}
	return level <= max
}

func (l *Logger) logf(level LogLevel, format string, args ...any) {
	if !l.Enabled(level) {
		return
	}
	// Addresses may carry a runtime's secret: it never reaches a log.
	msg := redactSecrets(l.prefix + fmt.Sprintf(format, args...))
	if l.out == nil && captured.hold(LogRecord{Level: level, Time: time.Now(), Name: l.name, Message: msg}) {
		return
	}
	line := fmt.Sprintf("%s rdt[%s] %s: %s\n", time.Now().Format("15:04:05.000000"), l.name, levelNames[level], msg)
	if l.out == nil {
		toStderr.push(line) // never blocks (logstderr.go)
		return
	}
	outMu.Lock()
	io.WriteString(l.out, line)
	outMu.Unlock()
}

func (l *Logger) Errorf(format string, args ...any) { l.logf(LogError, format, args...) }
func (l *Logger) Warnf(format string, args ...any)  { l.logf(LogWarn, format, args...) }
func (l *Logger) Infof(format string, args ...any)  { l.logf(LogInfo, format, args...) }
func (l *Logger) Debugf(format string, args ...any) { l.logf(LogDebug, format, args...) }

// FloodLog writes the first of a burst of like events at once, then at
// most one summary line per interval, so that a flood (a port scan, a peer
// retrying a wrong token in a loop) costs a few lines rather than one each.
type FloodLog struct {
	log      *Logger
	level    LogLevel
	interval time.Duration
	one      string // "control plane: refused a connection"
	many     string // "... refused %d more connections since %s"

	mu     sync.Mutex
	last   time.Time // when a line was last written
	held   int       // events since then, not written yet
	since  time.Time // when the first of them happened
	latest string    // the detail of the last of them
	timer  *time.Timer
	closed bool
}

// NewFloodLog logs events at level: one is the line's start for a single
// event, many a format taking the count held and the time of the first.
func NewFloodLog(log *Logger, level LogLevel, interval time.Duration, one, many string) *FloodLog {
	return &FloodLog{log: log, level: level, interval: interval, one: one, many: many}
}

// Event records one event; detail says what happened ("from X: why").
func (f *FloodLog) Event(detail string) {
	if !f.log.Enabled(f.level) {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	now := time.Now()
	if f.held == 0 && now.Sub(f.last) >= f.interval {
		f.last = now
		f.log.logf(f.level, "%s %s", f.one, detail)
		return
	}
	if f.held == 0 {
		f.since = now
	}
	f.held++
	f.latest = detail
	if f.timer == nil && !f.closed {
		f.timer = time.AfterFunc(f.last.Add(f.interval).Sub(now), f.flush)
	}
}

func (f *FloodLog) flush() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.timer = nil
	f.flushLocked()
}

func (f *FloodLog) flushLocked() {
	if f.held == 0 {
		return
	}
	f.log.logf(f.level, f.many+"; the last %s", f.held, f.since.Format("15:04:05"), f.latest)
	f.held = 0
	f.last = time.Now()
}

// Close writes what is held and stops the timer.
func (f *FloodLog) Close() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.closed = true
	if f.timer != nil {
		f.timer.Stop()
		f.timer = nil
	}
	f.flushLocked()
}
