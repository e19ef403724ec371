package transport

import (
	"errors"
	"strconv"
)

// A Setting is one environment variable, declared by the transport that
// reads it (in its TransportFactory) or by the engine. The engine's table
// is its own variables and every built-in transport's (docs/configuration.md
// prints it): a runtime reads and checks every variable read at creation,
// and hands the values to transports through Host.Settings, so transports
// never read the environment themselves.
type Setting struct {
	Name    string // the environment variable
	Type    string // what it holds, as the table shows it
	Default string // what applies when it is unset, in words
	Bounds  string // the values it takes, in words
	Meaning string
	// Where is "runtime" for a variable read and checked each time a
	// runtime is created (Check set), else the loader that reads it once
	// per process (a library path; Check nil).
	Where string
	// Check accepts a set, non-empty value (or any set value, with
	// KeepEmpty); its error says what is wanted, and the engine names the
	// variable.
	Check     func(value string) error
	KeepEmpty bool
}

// ReadAtRuntime is Setting.Where for variables every runtime reads.
const ReadAtRuntime = "runtime"

// IntSetting is an integer variable with bounds.
type IntSetting struct {
	Name               string
	Default, Min, Max  int
	Meaning            string
	Where              string // "": ReadAtRuntime
	DefaultDescription string // "": the default's digits
}

// Setting is the variable's row of the table.
func (s IntSetting) Setting() Setting {
	where, def := s.Where, s.DefaultDescription
	if where == "" {
		where = ReadAtRuntime
	}
	if def == "" {
		def = strconv.Itoa(s.Default)
	}
	lo, hi := s.Min, s.Max
	return Setting{Name: s.Name, Type: "integer", Default: def, Where: where, Meaning: s.Meaning,
		Bounds: strconv.Itoa(lo) + " to " + strconv.Itoa(hi),
		Check: func(v string) error {
			n, err := strconv.Atoi(v)
			if err != nil || n < lo || n > hi {
				return errors.New("want an integer from " + strconv.Itoa(lo) + " to " + strconv.Itoa(hi))
			}
			return nil
		}}
}

// In is the variable's value in v, or its default when unset.
func (s IntSetting) In(v Settings) int {
	if raw, ok := v.Lookup(s.Name); ok && raw != "" {
		if n, err := strconv.Atoi(raw); err == nil {
			return n
		}
	}
	return s.Default
}

// FlagSetting is a variable that is 0 or 1.
type FlagSetting struct {
	Name    string
	Default bool
	Meaning string
}

// Setting is the variable's row of the table.
func (s FlagSetting) Setting() Setting {
	def := "0"
	if s.Default {
		def = "1"
	}
	return Setting{Name: s.Name, Type: "0 or 1", Default: def, Bounds: "0 or 1", Where: ReadAtRuntime, Meaning: s.Meaning,
		Check: func(v string) error {
			if v != "0" && v != "1" {
				return errors.New("want 0 or 1")
			}
			return nil
		}}
}

// In is the variable's value in v, or its default when unset.
func (s FlagSetting) In(v Settings) bool {
	switch raw, _ := v.Lookup(s.Name); raw {
	case "0":
		return false
	case "1":
		return true
	}
	return s.Default
}

// Settings are the values of the variables a runtime read and checked at
// creation, by name; the zero value has none set, so every setting reads
// as its default.
type Settings struct {
	values map[string]string
}

// NewSettings holds values by variable name (a copy is kept). The engine
// makes it from the environment; tests make it by hand.
func NewSettings(values map[string]string) Settings {
	m := make(map[string]string, len(values))
	for k, v := range values {
		m[k] = v
	}
	return Settings{values: m}
}

// Lookup is the value of the variable name, and whether it was set.
func (s Settings) Lookup(name string) (string, bool) {
	v, ok := s.values[name]
	return v, ok
}
