package main

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/rdt-project/rdt/core/engine"
	"github.com/rdt-project/rdt/core/transport"
)

// The table of a library runtime: the engine's variables and every
// built-in transport's. The engine's tests hold the mechanism; these hold
// the table the library ships.

func builtinTable() []transport.Setting { return engine.Table(engine.SettingsOf(builtinTransports)) }

func lookupIn(m map[string]string) func(string) (string, bool) {
	return func(name string) (string, bool) {
		v, ok := m[name]
		return v, ok
	}
}

func readBuiltin(m map[string]string) (engine.Environment, error) {
	return engine.ReadEnvironment(lookupIn(m), engine.SettingsOf(builtinTransports))
}

func TestBuiltinTableDefaultsWhenNothingIsSet(t *testing.T) {
	env, err := readBuiltin(map[string]string{"RDT_TCP_STREAMS": "", "RDT_CMA_WORKERS": ""})
	require.NoError(t, err, "an empty value counts as unset")
	require.Equal(t, engine.Environment{LogLevel: transport.LogWarn, Settings: transport.NewSettings(nil)}, env)
}

func TestBuiltinTableTakesGoodValues(t *testing.T) {
	set := map[string]string{
		"RDT_LOG": "debug", "RDT_LISTEN": "0.0.0.0:0", "RDT_AUTH_TOKEN": "tok",
		"XDG_RUNTIME_DIR": "/run/user/7", "RDT_TCP_STREAMS": "16", "RDT_CMA_WORKERS": "4",
		"RDT_CMA_SET_PTRACER": "0", "RDT_SHM_ARENA_MIB": "0", "RDT_CUDA_IPC_CACHE": "0", "CUDA_VISIBLE_DEVICES": "",
		"RDT_NCCL_TEARDOWN_MS": "0",
	}
	env, err := readBuiltin(set)
	require.NoError(t, err)
	require.Equal(t, engine.Environment{LogLevel: transport.LogDebug, Listen: "0.0.0.0:0", AuthToken: "tok",
		RuntimeDir: "/run/user/7", Settings: transport.NewSettings(set)}, env)
	mask, ok := env.Settings.Lookup("CUDA_VISIBLE_DEVICES")
	require.True(t, ok, "an empty device mask is kept: it means no device")
	require.Empty(t, mask)
}

func TestBuiltinTableRejectsBadValuesByName(t *testing.T) {
	for _, c := range []struct{ name, value string }{
		{"RDT_CMA_WORKERS", "0"},
		{"RDT_CMA_WORKERS", "abc"},
		{"RDT_CMA_WORKERS", "5"},
		{"RDT_TCP_STREAMS", "17"},
		{"RDT_TCP_STREAMS", "four"},
		{"RDT_SHM_ARENA_MIB", "4097"},
		{"RDT_CUDA_IPC_CACHE", "-1"},
		{"RDT_CUDA_IPC_CACHE", "many"},
		{"RDT_NCCL_TEARDOWN_MS", "-1"},
		{"RDT_NCCL_TEARDOWN_MS", "3600001"},
		{"RDT_CMA_SET_PTRACER", "yes"},
		{"RDT_LOG", "loud"},
		{"XDG_RUNTIME_DIR", "relative/dir"},
	} {
		_, err := readBuiltin(map[string]string{c.name: c.value})
		require.Error(t, err, "%s=%s", c.name, c.value)
		require.Equal(t, transport.ErrInvalidArgument, transport.StatusOf(err), "%v", err)
		require.Contains(t, err.Error(), c.name+"="+strconv.Quote(c.value))
	}
}

// Each name is declared once, or alike wherever several transports declare
// it (the CUDA driver's path).
func TestBuiltinSettingsAgreeOnSharedNames(t *testing.T) {
	first := map[string]transport.Setting{}
	for _, s := range engine.SettingsOf(builtinTransports) {
		if f, ok := first[s.Name]; ok {
			require.Equal(t, [5]string{f.Type, f.Default, f.Bounds, f.Meaning, f.Where}, [5]string{s.Type, s.Default, s.Bounds, s.Meaning, s.Where},
				"%s is declared twice, differently", s.Name)
			continue
		}
		first[s.Name] = s
	}
	for _, s := range engine.EngineVariables() {
		_, clash := first[s.Name]
		require.False(t, clash, "%s is the engine's and a transport's", s.Name)
	}
}

// environmentReads are the calls that read or change the process
// environment.
var environmentReads = map[string]map[string]bool{
	"os":      {"Getenv": true, "LookupEnv": true, "Environ": true, "ExpandEnv": true, "Setenv": true, "Unsetenv": true, "Clearenv": true},
	"syscall": {"Getenv": true, "Environ": true, "Setenv": true, "Unsetenv": true, "Clearenv": true},
	"unix":    {"Getenv": true, "Environ": true, "Setenv": true, "Unsetenv": true, "Clearenv": true},
	"C":       {"getenv": true, "secure_getenv": true, "setenv": true, "putenv": true, "unsetenv": true},
}

// loaderReads are the places outside the table allowed to touch the
// environment: library loaders, once per process, for the variables the
// table lists as theirs ("" is the argument of a helper that reads the C
// environment for them).
var loaderReads = map[string][]string{
	"transports/internal/cuda/cuda.go": {"RDT_CUDA_LIBRARY"},
	"transports/nccl/lib.go":           {"RDT_NCCL_LIBRARY"},
	"transports/nixl/lib.go": {"", "RDT_NIXL_LIBRARY", "UCX_HANDLE_ERRORS", "UCX_CUDA_IPC_ENABLE_GET_ZCOPY",
		"UCX_TCP_USER_TIMEOUT", "UCX_TCP_KEEPIDLE", "UCX_TCP_KEEPINTVL", "UCX_TCP_KEEPCNT"},
	"transports/nixl/nixl.go": {"UCX_TLS"},
}

func TestOnlyTheTableReadsTheEnvironment(t *testing.T) {
	root, err := filepath.Abs("..")
	require.NoError(t, err)
	_, err = os.Stat(filepath.Join(root, "go.mod"))
	require.NoError(t, err, "the module root is one level up")
	table := map[string]transport.Setting{}
	for _, v := range builtinTable() {
		table[v.Name] = v
	}
	loaderSeen := map[string]bool{}
	var bad []string
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if name := d.Name(); path != root && (strings.HasPrefix(name, ".") || name == "build" || name == "testdata") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		// Test-support packages (named like httptest: core/transport/
		// transporttest) are never built into the library; the variables
		// they read start their own child processes, not a runtime.
		if strings.HasSuffix(filepath.Base(filepath.Dir(path)), "test") {
			return nil
		}
		rel, _ := filepath.Rel(root, path)
		rel = filepath.ToSlash(rel)
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, 0)
		if err != nil {
			return err
		}
		consts := stringConsts(t, filepath.Dir(path))
		ast.Inspect(f, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok {
				return true
			}
			if !touchesEnvironment(call.Fun) {
				return true
			}
			name := ""
			if len(call.Args) > 0 {
				switch a := call.Args[0].(type) {
				case *ast.BasicLit:
					name, _ = strconv.Unquote(a.Value)
				case *ast.Ident:
					name = consts[a.Name]
				}
			}
			switch {
			case rel == "core/engine/config.go":
			case contains(loaderReads[rel], name) && (name == "" || table[name].Check == nil && table[name].Name == name):
				loaderSeen[name] = true
			default:
				bad = append(bad, rel+": "+name)
			}
			return true
		})
		return nil
	})
	require.NoError(t, err)
	sort.Strings(bad)
	require.Empty(t, bad, "read the environment through the table (core/engine/config.go and the transports' settings), not here")
	for _, v := range builtinTable() {
		if v.Check == nil {
			require.True(t, loaderSeen[v.Name], "the table lists %s as a loader's, but no loader reads it", v.Name)
		}
	}
}

func touchesEnvironment(fun ast.Expr) bool {
	switch f := fun.(type) {
	case *ast.SelectorExpr:
		pkg, ok := f.X.(*ast.Ident)
		return ok && environmentReads[pkg.Name][f.Sel.Name]
	case *ast.Ident:
		return f.Name == "cgetenv"
	}
	return false
}

// stringConsts are the package-level string constants of the Go files in dir.
func stringConsts(t *testing.T, dir string) map[string]string {
	pkgs, err := parser.ParseDir(token.NewFileSet(), dir, func(fi fs.FileInfo) bool { return !strings.HasSuffix(fi.Name(), "_test.go") }, 0)
	require.NoError(t, err)
	out := map[string]string{}
	for _, p := range pkgs {
		for _, f := range p.Files {
			for _, d := range f.Decls {
				g, ok := d.(*ast.GenDecl)
				if !ok || g.Tok != token.CONST {
					continue
				}
				for _, s := range g.Specs {
					vs := s.(*ast.ValueSpec)
					for i, n := range vs.Names {
						if i < len(vs.Values) {
							if lit, ok := vs.Values[i].(*ast.BasicLit); ok && lit.Kind == token.STRING {
								out[n.Name], _ = strconv.Unquote(lit.Value)
							}
						}
					}
				}
			}
		}
	}
	return out
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func TestConfigurationDocListsEveryVariable(t *testing.T) {
	doc, err := os.ReadFile("../docs/configuration.md")
	require.NoError(t, err)
	for _, v := range builtinTable() {
		require.Contains(t, string(doc), "`"+v.Name+"`", "docs/configuration.md lists %s", v.Name)
	}
}
