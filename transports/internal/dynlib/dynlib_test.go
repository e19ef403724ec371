package dynlib

import (
	"errors"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rdt-project/rdt/core/transport"
)

// libc is a library every test machine has, with symbols known to be there.
const libc = "libc.so.6"

func TestPathPrefersTheOverride(t *testing.T) {
	assert.Equal(t, "libx.so.1", Path("", "libx.so.1"))
	assert.Equal(t, "/opt/libx.so", Path("/opt/libx.so", "libx.so.1"))
}

func TestOpenReportsDlerror(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "libmissing.so")
	_, err := Open(missing)
	var oe *OpenError
	require.True(t, errors.As(err, &oe), "%v", err)
	assert.Equal(t, missing, oe.Path)
	assert.Contains(t, err.Error(), missing, "dlerror names the file")
}

func TestOpenTakesTheFirstCandidateThatLoads(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "libmissing.so")
	l, err := Open(missing, libc)
	require.NoError(t, err)
	assert.Equal(t, libc, l.Path)
	assert.NotNil(t, l.Lookup("getpid"))

	_, err = Open(missing, missing+".2")
	var oe *OpenError
	require.True(t, errors.As(err, &oe))
	assert.Equal(t, missing, oe.Path, "the first candidate is the one named")
	assert.Contains(t, err.Error(), missing+".2", "and every reason is given")
}

func TestResolveNamesTheMissingSymbol(t *testing.T) {
	l, err := Open(libc)
	require.NoError(t, err)
	fns, err := l.Resolve([]Symbol{{Name: "getpid"}, {Name: "rdt_no_such_function"}, {Name: "getppid"}})
	assert.Nil(t, fns)
	var me *MissingSymbolError
	require.True(t, errors.As(err, &me), "%v", err)
	assert.Equal(t, "rdt_no_such_function", me.Symbol)
	assert.Equal(t, libc+" has no symbol rdt_no_such_function", err.Error())
}

func TestResolveTriesOlderNamesAndSkipsOptionalOnes(t *testing.T) {
	l, err := Open(libc)
	require.NoError(t, err)
	fns, err := l.Resolve([]Symbol{
		{Name: "getpid"},
		{Name: "rdt_no_such_function_v2", Older: "getppid"},
		{Name: "rdt_no_such_function", Optional: true},
	})
	require.NoError(t, err)
	require.Len(t, fns, 3)
	assert.Equal(t, l.Lookup("getpid"), fns[0])
	assert.Equal(t, l.Lookup("getppid"), fns[1], "the older name stands in")
	assert.Nil(t, fns[2], "a missing optional symbol is nil")
}

func TestOpenTable(t *testing.T) {
	l, fns, err := OpenTable([]Symbol{{Name: "getpid"}}, libc)
	require.NoError(t, err)
	assert.Equal(t, libc, l.Path)
	assert.Equal(t, []any{l.Lookup("getpid")}, []any{fns[0]})
	_, _, err = OpenTable([]Symbol{{Name: "rdt_no_such_function"}}, libc)
	var me *MissingSymbolError
	assert.True(t, errors.As(err, &me))
}

func TestOnceLoadsOnceAndKeepsTheResult(t *testing.T) {
	var o Once
	var runs atomic.Int32
	fail := errors.New("no library")
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := o.Do(func() error { runs.Add(1); return fail })
			assert.Same(t, fail, err)
		}()
	}
	wg.Wait()
	assert.Equal(t, int32(1), runs.Load())
	assert.Same(t, fail, o.Do(func() error { return nil }), "a failure is not retried")
}

func TestByPathKeepsTheFirstLoadAndEachFailure(t *testing.T) {
	var b ByPath
	var runs atomic.Int32
	fail := errors.New("cannot load a")
	assert.Same(t, fail, b.Load("a", func() error { runs.Add(1); return fail }))
	assert.Same(t, fail, b.Load("a", func() error { runs.Add(1); return nil }), "a failed path is not tried again")
	assert.Equal(t, int32(1), runs.Load())

	require.NoError(t, b.Load("b", func() error { runs.Add(1); return nil }), "another path may be tried")
	require.NoError(t, b.Load("b", func() error { runs.Add(1); return fail }), "a loaded path is not loaded again")
	assert.Equal(t, int32(2), runs.Load())

	err := b.Load("c", func() error { runs.Add(1); return nil })
	assert.Equal(t, transport.ErrUnsupported, transport.StatusOf(err))
	assert.Equal(t, "b is already loaded in this process; cannot also load c", err.Error())
	assert.Equal(t, int32(2), runs.Load())
}
