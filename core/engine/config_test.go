package engine

import (
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/rdt-project/rdt/core/transport"
)

func lookupIn(m map[string]string) func(string) (string, bool) {
	return func(name string) (string, bool) {
		v, ok := m[name]
		return v, ok
	}
}

// Settings a transport of these tests declares, as built-in transports
// declare theirs (the library's own table is tested in capi).
var (
	probeCount = transport.IntSetting{Name: "RDT_PROBE_COUNT", Default: 3, Min: 1, Max: 8, Meaning: "probes"}
	probeFlag  = transport.FlagSetting{Name: "RDT_PROBE_FLAG", Default: true, Meaning: "a flag"}
	probeText  = transport.Setting{Name: "RDT_PROBE_TEXT", Type: "text", Where: transport.ReadAtRuntime, KeepEmpty: true,
		Check: func(string) error { return nil }}
	probeLoader = transport.Setting{Name: "RDT_PROBE_LIBRARY", Type: "path", Where: "a loader"}
)

func probeSettings() []transport.Setting {
	return []transport.Setting{probeCount.Setting(), probeFlag.Setting(), probeText, probeLoader}
}

func TestReadEnvironmentDefaultsWhenNothingIsSet(t *testing.T) {
	env, err := ReadEnvironment(lookupIn(map[string]string{"RDT_PROBE_COUNT": "", "RDT_LOG": ""}), probeSettings())
	require.NoError(t, err, "an empty value counts as unset")
	require.Equal(t, Environment{LogLevel: transport.LogWarn, Settings: transport.NewSettings(nil)}, env)
	require.Equal(t, 3, probeCount.In(env.Settings))
	require.True(t, probeFlag.In(env.Settings))
	_, set := env.Settings.Lookup(probeText.Name)
	require.False(t, set)
}

func TestReadEnvironmentTakesGoodValues(t *testing.T) {
	env, err := ReadEnvironment(lookupIn(map[string]string{
		"RDT_LOG": "debug", "RDT_LISTEN": "0.0.0.0:0", "RDT_AUTH_TOKEN": "tok",
		"XDG_RUNTIME_DIR": "/run/user/7", "RDT_PROBE_COUNT": "8", "RDT_PROBE_FLAG": "0", "RDT_PROBE_TEXT": "",
		"RDT_PROBE_LIBRARY": "/not/read/by/the/runtime.so",
	}), probeSettings())
	require.NoError(t, err)
	require.Equal(t, Environment{LogLevel: transport.LogDebug, Listen: "0.0.0.0:0", AuthToken: "tok", RuntimeDir: "/run/user/7",
		Settings: transport.NewSettings(map[string]string{"RDT_LOG": "debug", "RDT_LISTEN": "0.0.0.0:0", "RDT_AUTH_TOKEN": "tok",
			"XDG_RUNTIME_DIR": "/run/user/7", "RDT_PROBE_COUNT": "8", "RDT_PROBE_FLAG": "0", "RDT_PROBE_TEXT": ""})}, env,
		"a loader's variable is not the runtime's to read")
	require.Equal(t, 8, probeCount.In(env.Settings))
	require.False(t, probeFlag.In(env.Settings))
	text, set := env.Settings.Lookup(probeText.Name)
	require.True(t, set, "KeepEmpty keeps an empty value")
	require.Empty(t, text)
}

func TestReadEnvironmentRejectsBadValuesByName(t *testing.T) {
	for _, c := range []struct{ name, value string }{
		{"RDT_PROBE_COUNT", "0"},
		{"RDT_PROBE_COUNT", "abc"},
		{"RDT_PROBE_COUNT", "9"},
		{"RDT_PROBE_FLAG", "yes"},
		{"RDT_LOG", "loud"},
		{"XDG_RUNTIME_DIR", "relative/dir"},
	} {
		_, err := ReadEnvironment(lookupIn(map[string]string{c.name: c.value}), probeSettings())
		require.Error(t, err, "%s=%s", c.name, c.value)
		require.Equal(t, transport.ErrInvalidArgument, transport.StatusOf(err), "%v", err)
		require.Contains(t, err.Error(), c.name+"="+strconv.Quote(c.value))
	}
}

func TestTableListsTheEngineFirstAndEachNameOnce(t *testing.T) {
	table := Table(append(probeSettings(), probeCount.Setting()))
	var names []string
	for _, v := range table {
		names = append(names, v.Name)
	}
	require.Equal(t, []string{"RDT_LOG", "RDT_LISTEN", "RDT_AUTH_TOKEN", "XDG_RUNTIME_DIR",
		"RDT_PROBE_COUNT", "RDT_PROBE_FLAG", "RDT_PROBE_TEXT", "RDT_PROBE_LIBRARY"}, names)
	require.Equal(t, "1 to 8", table[4].Bounds)
	require.Equal(t, "integer", table[4].Type)
	require.Equal(t, "3", table[4].Default)
}

func TestNewRuntimeFailsOnABadVariable(t *testing.T) {
	t.Setenv("RDT_PROBE_COUNT", "0")
	_, err := NewRuntime(Options{Name: "bad", LogLevel: transport.LogOff, Settings: probeSettings()})
	require.Equal(t, transport.ErrInvalidArgument, transport.StatusOf(err), "%v", err)
	require.Contains(t, err.Error(), `RDT_PROBE_COUNT="0"`, "checked though the runtime makes no transport")

	_, err = NewRuntime(Options{Name: "bad", LogLevel: transport.LogOff, Builtins: []transport.TransportFactory{{
		Name: "probe", Settings: probeSettings(),
		New: func(transport.Host) (transport.Transport, error) { panic("not made: its variable is bad") }}}})
	require.Equal(t, transport.ErrInvalidArgument, transport.StatusOf(err), "%v", err)
	require.Contains(t, err.Error(), `RDT_PROBE_COUNT="0"`, "a factory's settings are checked by default")
}

func TestRuntimeHandsTransportsTheSettingsItRead(t *testing.T) {
	t.Setenv("RDT_PROBE_COUNT", "5")
	t.Setenv("RDT_PROBE_TEXT", "1")
	var seen transport.Settings
	rt := newRuntime(t, "settings", func(o *Options) {
		o.Builtins = []transport.TransportFactory{{Name: "probe", Settings: probeSettings(), New: func(h transport.Host) (transport.Transport, error) {
			seen = h.Settings()
			return nil, transport.Errorf(transport.ErrUnsupported, "only looks")
		}}}
	})
	require.Equal(t, 5, probeCount.In(seen))
	require.True(t, probeFlag.In(seen))
	text, _ := seen.Lookup(probeText.Name)
	require.Equal(t, "1", text)
	require.Equal(t, seen, rt.host.Settings())
}

func TestRDTLogSetsTheDefaultLevel(t *testing.T) {
	t.Setenv("RDT_LOG", "debug")
	require.True(t, newRuntime(t, "dbg", func(o *Options) { o.LogLevel = transport.LogDefault }).log.Enabled(transport.LogDebug))
	require.False(t, newRuntime(t, "quiet").log.Enabled(transport.LogError), "an explicit level wins")
}

func TestListenAndTokenComeFromTheEnvironmentOnlyWhenAsked(t *testing.T) {
	t.Setenv("RDT_LISTEN", "no-port-here")
	rt := newRuntime(t, "plain") // Go callers set ListenTCP themselves
	require.Empty(t, rt.opts.ListenTCP)

	_, err := NewRuntime(Options{Name: "env", LogLevel: transport.LogOff, EnvironmentDefaults: true})
	require.Equal(t, transport.ErrInvalidArgument, transport.StatusOf(err), "%v", err)
	require.Contains(t, err.Error(), `RDT_LISTEN="no-port-here"`)

	t.Setenv("RDT_LISTEN", "127.0.0.1:0")
	t.Setenv("RDT_AUTH_TOKEN", "from-env")
	rt = newRuntime(t, "env", func(o *Options) { o.EnvironmentDefaults = true })
	require.Equal(t, "from-env", rt.host.AuthToken())
	require.Equal(t, "127.0.0.1", rt.host.BindHost())
}
