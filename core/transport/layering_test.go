package transport_test

import (
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

const module = "github.com/rdt-project/rdt/"

// goImport is one import of the project's own packages, by the directory
// of the importing file (relative to the module root).
type goImport struct {
	file, dir, path string
	test            bool
}

func projectImports(t *testing.T) []goImport {
	root, err := filepath.Abs("../..")
	require.NoError(t, err)
	_, err = os.Stat(filepath.Join(root, "go.mod"))
	require.NoError(t, err, "the module root is two levels up")
	var out []goImport
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
		if !strings.HasSuffix(path, ".go") {
			return nil
		}
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.ImportsOnly)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		for _, imp := range f.Imports {
			p, _ := strconv.Unquote(imp.Path.Value)
			if strings.HasPrefix(p, module) {
				out = append(out, goImport{file: rel, dir: filepath.ToSlash(filepath.Dir(rel)),
					path: strings.TrimPrefix(p, module), test: strings.HasSuffix(path, "_test.go")})
			}
		}
		return nil
	})
	require.NoError(t, err)
	require.NotEmpty(t, out, "the walk found the project's imports")
	return out
}

// The dependency rule of docs/design.md ("Layout and dependency rule"):
// imports run one way, bindings → capi → core/engine → core/control →
// core/transport ← transports/*, and no transport imports another.
func TestImportsFollowTheDependencyRule(t *testing.T) {
	for _, imp := range projectImports(t) {
		switch {
		case imp.dir == "core/transport":
			t.Errorf("%s imports %s: core/transport is the leaf and imports no project package", imp.file, imp.path)
		case imp.dir == "core/transport/transporttest":
			if imp.path != "core/transport" {
				t.Errorf("%s imports %s: the conformance suite imports only core/transport, so transports may use it", imp.file, imp.path)
			}
		case imp.dir == "core/control" || strings.HasPrefix(imp.dir, "core/control/"):
			if imp.path != "core/transport" && !(imp.test && imp.path == "core/transport/transporttest") {
				t.Errorf("%s imports %s: the control plane imports only core/transport (its tests also the kit in core/transport/transporttest)", imp.file, imp.path)
			}
		case imp.dir == "core/engine" || strings.HasPrefix(imp.dir, "core/engine/"):
			if imp.path != "core/transport" && imp.path != "core/control" && !strings.HasPrefix(imp.path, "core/engine/") &&
				!(imp.test && imp.path == "core/transport/transporttest") {
				t.Errorf("%s imports %s: the engine imports only core/control and core/transport (its tests also core/transport/transporttest)", imp.file, imp.path)
			}
		case imp.dir == "core" || strings.HasPrefix(imp.dir, "core/"):
			t.Errorf("%s imports %s: core/ holds only its three layers (transport, control, engine)", imp.file, imp.path)
		case strings.HasPrefix(imp.dir, "transports/internal/"):
			// A shared test-support package (its name ends in "test", as
			// transporttest's does) serves transports' tests, which run the
			// conformance suite: it may use the kit too.
			kit := strings.HasSuffix(imp.dir, "test") && imp.path == "core/transport/transporttest"
			if imp.path != "core/transport" && !strings.HasPrefix(imp.path, "transports/internal/") && !kit {
				t.Errorf("%s imports %s: shared transport code imports only core/transport (a shared test-support package also the kit)", imp.file, imp.path)
			}
		case strings.HasPrefix(imp.dir, "transports/"):
			allowed := imp.path == "core/transport" || strings.HasPrefix(imp.path, "transports/internal/") ||
				// Its tests run the conformance suite.
				(imp.test && imp.path == "core/transport/transporttest") ||
				// A transport's own tests may drive it through a whole runtime.
				(imp.test && (imp.path == "core/engine" || imp.path == "core/control"))
			if !allowed {
				t.Errorf("%s imports %s: a transport imports only core/transport and transports/internal (its tests also core/engine and core/control), never another transport", imp.file, imp.path)
			}
		}
	}
}

// The rule's test must notice a violation: the walk sees the imports it
// polices.
func TestImportWalkSeesTransportsAndCore(t *testing.T) {
	seen := map[string]bool{}
	for _, imp := range projectImports(t) {
		seen[imp.dir+" -> "+imp.path] = true
	}
	require.True(t, seen["core/engine -> core/transport"], "the engine's import of the leaf is seen")
	require.True(t, seen["core/engine -> core/control"], "the engine's import of the control plane is seen")
	require.True(t, seen["core/control -> core/transport"], "the control plane's import of the leaf is seen")
	require.True(t, seen["transports/tcp -> core/transport"], "a transport's import of the leaf is seen")
	require.True(t, seen["capi -> core/engine"], "capi's import of the engine is seen")
	require.True(t, seen["core/transport/transporttest -> core/transport"], "the conformance suite's import of the leaf is seen")
	require.True(t, seen["transports/tcp -> core/transport/transporttest"], "a transport test's import of the suite is seen")
}

// core/ shows the floors: it holds the three layers as sibling folders and
// no code of its own.
func TestCoreHoldsOnlyItsLayers(t *testing.T) {
	entries, err := os.ReadDir("..")
	require.NoError(t, err)
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	require.ElementsMatch(t, []string{"control", "engine", "transport"}, names,
		"core/ holds transport (the leaf), control and engine, and nothing else")
}
