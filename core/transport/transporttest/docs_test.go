package transporttest

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/rdt-project/rdt/core/transport"
)

// docs/transports.md describes the suite's cases, the descriptor's fields,
// the contract's interfaces and each transport's files; these tests hold it
// to the code, so that adding one of them without a line there fails.

const transportsDoc = "../../../docs/transports.md"

var backticked = regexp.MustCompile("`([^`]+)`")

// table returns the rows of the Markdown table whose header line is
// header, each row's cells trimmed.
func table(t *testing.T, doc, header string) [][]string {
	t.Helper()
	lines := strings.Split(doc, "\n")
	i := slices.Index(lines, header)
	if i < 0 {
		t.Fatalf("%s has no table headed %q", transportsDoc, header)
	}
	var rows [][]string
	for _, line := range lines[i+2:] { // past the header and its rule
		if !strings.HasPrefix(line, "|") {
			break
		}
		cells := strings.Split(strings.Trim(line, "|"), "|")
		for j := range cells {
			cells[j] = strings.TrimSpace(cells[j])
		}
		rows = append(rows, cells)
	}
	return rows
}

func readDoc(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(transportsDoc)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// names are the backticked names of a column of rows.
func names(rows [][]string, col int) []string {
	var out []string
	for _, r := range rows {
		for _, m := range backticked.FindAllStringSubmatch(r[col], -1) {
			out = append(out, m[1])
		}
	}
	return out
}

func TestDocsListEveryConformanceCaseInOrder(t *testing.T) {
	want := slices.Concat(Cases, WriteCases, PreparedCases, ViewCases)
	got := names(table(t, readDoc(t), "| case | asserts |"), 0)
	if !slices.Equal(got, want) {
		t.Errorf("the case table of %s lists %v; the suite runs %v", transportsDoc, got, want)
	}
}

func TestDocsListEveryDescriptorField(t *testing.T) {
	var want []string
	for f := range reflect.TypeFor[transport.Descriptor]().Fields() {
		want = append(want, f.Name)
	}
	got := names(table(t, readDoc(t), "| field | meaning |"), 0)
	sort.Strings(want)
	sort.Strings(got)
	if !slices.Equal(got, want) {
		t.Errorf("the descriptor table of %s lists %v; transport.Descriptor has %v", transportsDoc, got, want)
	}
}

// TestDocsNameEveryInterfaceOfTheContract: every interface package
// transport declares is named (as transport.X) in the document.
func TestDocsNameEveryInterfaceOfTheContract(t *testing.T) {
	doc := readDoc(t)
	pkgs, err := parser.ParseDir(token.NewFileSet(), "..", func(fi os.FileInfo) bool {
		return !strings.HasSuffix(fi.Name(), "_test.go")
	}, 0)
	if err != nil {
		t.Fatal(err)
	}
	var missing []string
	for _, pkg := range pkgs {
		for _, f := range pkg.Files {
			for _, d := range f.Decls {
				g, ok := d.(*ast.GenDecl)
				if !ok || g.Tok != token.TYPE {
					continue
				}
				for _, s := range g.Specs {
					ts := s.(*ast.TypeSpec)
					named := regexp.MustCompile(`transport\.` + ts.Name.Name + `\b`)
					if _, isInterface := ts.Type.(*ast.InterfaceType); isInterface && ts.Name.IsExported() &&
						!named.MatchString(doc) {
						missing = append(missing, ts.Name.Name)
					}
				}
			}
		}
	}
	sort.Strings(missing)
	if len(missing) > 0 {
		t.Errorf("%s does not name these interfaces of package transport (as transport.X): %v", transportsDoc, missing)
	}
}

// TestDocsFileTableHoldsEveryTransportFile: every source file of every
// built-in transport is named in the file table, or is the one named
// after its package (the table's `<name>.go`).
func TestDocsFileTableHoldsEveryTransportFile(t *testing.T) {
	documented := names(table(t, readDoc(t), "| file | holds |"), 0)
	documented = append(documented, names(table(t, readDoc(t), "| file | holds |"), 1)...)
	dirs, err := filepath.Glob("../../../transports/*")
	if err != nil {
		t.Fatal(err)
	}
	var missing []string
	for _, dir := range dirs {
		name := filepath.Base(dir)
		if name == "internal" {
			continue // helpers shared by transports, not a transport
		}
		files, err := os.ReadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range files {
			n := f.Name()
			source := strings.HasSuffix(n, ".go") || strings.HasSuffix(n, ".c") || strings.HasSuffix(n, ".h")
			if f.IsDir() || !source || strings.HasSuffix(n, "_test.go") || n == name+".go" || slices.Contains(documented, n) {
				continue
			}
			missing = append(missing, name+"/"+n)
		}
	}
	if len(missing) > 0 {
		t.Errorf("the file table of %s does not say what these hold: %v", transportsDoc, missing)
	}
}
