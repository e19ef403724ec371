package engine

import (
	"errors"
	"os"
	"path/filepath"

	"github.com/rdt-project/rdt/core/transport"
)

// EngineVariables are the environment variables the engine itself reads;
// each transport declares its own in its TransportFactory. Table joins
// them into the one table docs/configuration.md prints. Nothing else in
// the Go tree reads the environment, except the library loaders the
// transports name in their settings' Where.
func EngineVariables() []transport.Setting {
	anyValue := func(string) error { return nil }
	return []transport.Setting{
		{Name: "RDT_LOG", Type: "level", Default: "warn", Where: transport.ReadAtRuntime,
			Meaning: "log level of runtimes created with RDT_LOG_DEFAULT (lines go to stderr)",
			Bounds:  "off, error, warn, info or debug (also none/0, warning, trace)",
			Check: func(v string) error {
				if _, ok := transport.ParseLogLevel(v); !ok {
					return errors.New("want off, error, warn, info or debug")
				}
				return nil
			}},
		{Name: "RDT_LISTEN", Type: "host:port", Default: "unset (Unix socket only)", Where: transport.ReadAtRuntime,
			Meaning: "listen_tcp of runtimes created through the C API with listen_tcp NULL",
			Bounds:  "an address the control plane can listen on", Check: anyValue},
		{Name: "RDT_AUTH_TOKEN", Type: "string", Default: "unset (TCP binds loopback only)", Where: transport.ReadAtRuntime,
			Meaning: "auth_token of runtimes created through the C API with auth_token NULL",
			Bounds:  "any", Check: anyValue},
		{Name: "XDG_RUNTIME_DIR", Type: "path", Default: "unset (<tmp>/rdt-<uid>)", Where: transport.ReadAtRuntime,
			Meaning: "parent of the default socket_dir ($XDG_RUNTIME_DIR/rdt)",
			Bounds:  "an absolute path",
			Check: func(v string) error {
				if !filepath.IsAbs(v) {
					return errors.New("want an absolute path")
				}
				return nil
			}},
	}
}

// Table is every environment variable a runtime reads whose transports
// declare settings: the engine's own, then the settings in order (a name
// declared twice, such as a driver library several transports open, is
// listed once).
func Table(settings []transport.Setting) []transport.Setting {
	out := EngineVariables()
	seen := map[string]bool{}
	for _, v := range out {
		seen[v.Name] = true
	}
	for _, s := range settings {
		if !seen[s.Name] {
			seen[s.Name] = true
			out = append(out, s)
		}
	}
	return out
}

// SettingsOf are the settings the factories declare, in order.
func SettingsOf(factories []transport.TransportFactory) []transport.Setting {
	var out []transport.Setting
	for _, f := range factories {
		out = append(out, f.Settings...)
	}
	return out
}

// Environment is what the variables said when a runtime was created.
type Environment struct {
	Listen     string             // RDT_LISTEN ("": unset)
	AuthToken  string             // RDT_AUTH_TOKEN ("": unset)
	LogLevel   transport.LogLevel // RDT_LOG (LogWarn when unset)
	RuntimeDir string             // XDG_RUNTIME_DIR ("": unset)
	Settings   transport.Settings // every checked value set, by name, for the transports
}

// ReadEnvironment reads and checks, through lookup (os.LookupEnv in a
// runtime), every variable of Table(settings) that a runtime reads at
// creation. An empty value counts as unset (unless the setting keeps
// empty values); any other value out of bounds is an ErrInvalidArgument
// error that names the variable and the value.
func ReadEnvironment(lookup func(name string) (string, bool), settings []transport.Setting) (Environment, error) {
	values := map[string]string{}
	for _, v := range Table(settings) {
		value, set := lookup(v.Name)
		if v.Check == nil || !set || (value == "" && !v.KeepEmpty) {
			continue
		}
		if err := v.Check(value); err != nil {
			return Environment{}, transport.Errorf(transport.ErrInvalidArgument,
				"environment variable %s=%q: %v", v.Name, value, err)
		}
		values[v.Name] = value
	}
	env := Environment{LogLevel: transport.LogWarn, Listen: values["RDT_LISTEN"], AuthToken: values["RDT_AUTH_TOKEN"],
		RuntimeDir: values["XDG_RUNTIME_DIR"], Settings: transport.NewSettings(values)}
	if l, ok := transport.ParseLogLevel(values["RDT_LOG"]); ok && values["RDT_LOG"] != "" {
		env.LogLevel = l
	}
	return env, nil
}

func readProcessEnvironment(settings []transport.Setting) (Environment, error) {
	return ReadEnvironment(os.LookupEnv, settings)
}
