package core

import (
	"fmt"
	"os"
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

// envLogLevel is RDT_LOG, or warn when unset or unreadable.
func envLogLevel() LogLevel {
	if l, ok := ParseLogLevel(os.Getenv("RDT_LOG")); ok {
		return l
	}
	return LogWarn
}

// Logger writes leveled lines to stderr, prefixed with the runtime name.
type Logger struct {
	name  string
	level LogLevel
}

var stderrMu sync.Mutex

// NewLogger makes a logger; LogDefault means RDT_LOG or warn.
func NewLogger(name string, level LogLevel) *Logger {
	if level == LogDefault {
		level = envLogLevel()
	}
	return &Logger{name: name, level: level}
}

// Enabled reports whether messages at level l are written.
func (l *Logger) Enabled(level LogLevel) bool {
	return l != nil && level != LogOff && level <= l.level
}

func (l *Logger) logf(level LogLevel, format string, args ...any) {
	if !l.Enabled(level) {
		return
	}
	msg := fmt.Sprintf(format, args...)
	line := fmt.Sprintf("%s rdt[%s] %s: %s\n", time.Now().Format("15:04:05.000000"), l.name, levelNames[level], msg)
	stderrMu.Lock()
	os.Stderr.WriteString(line)
	stderrMu.Unlock()
}

func (l *Logger) Errorf(format string, args ...any) { l.logf(LogError, format, args...) }
func (l *Logger) Warnf(format string, args ...any)  { l.logf(LogWarn, format, args...) }
func (l *Logger) Infof(format string, args ...any)  { l.logf(LogInfo, format, args...) }
func (l *Logger) Debugf(format string, args ...any) { l.logf(LogDebug, format, args...) }
