package tcp

import (
	"context"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rdt-project/rdt/core/engine"
	"github.com/rdt-project/rdt/core/transport"
	"github.com/rdt-project/rdt/core/transport/transporttest"
)

// runtimeObject puts a tcp object of n patterned bytes in a real runtime
// configured with token and returns its tcp metadata, as a ref carries it.
func runtimeObject(t *testing.T, token string, n int) (*engine.Runtime, []byte, []byte) {
	t.Helper()
	rt, err := engine.NewRuntime(engine.Options{Name: "owner", LogLevel: transport.LogOff, AuthToken: token,
		Builtins: []transport.TransportFactory{Factory()}, SocketDir: t.TempDir()})
	require.NoError(t, err)
	t.Cleanup(rt.Destroy)
	b, x := transporttest.Buffer(t, n)
	transporttest.Fill(b, 42)
	ref, err := rt.Put([]transport.Tensor{x}, "tcp", nil)
	require.NoError(t, err)
	t.Cleanup(func() { ref.Release() })
	bytes, err := ref.Serialize()
	require.NoError(t, err)
	desc, _, err := engine.DecodeRef(bytes)
	require.NoError(t, err)
	require.Contains(t, desc.Meta, "tcp")
	return rt, desc.Meta["tcp"], b
}

// withoutKey is what someone who knows the endpoint and the object id, but
// not the key, can make.
func withoutKey(t *testing.T, tmeta []byte) []byte {
	m, err := decodeMetadata(tmeta)
	require.NoError(t, err)
	m.Key = ""
	return m.encode()
}

func TestNoTokenRequiresTheKeyFromTheMetadata(t *testing.T) {
	rt, tmeta, want := runtimeObject(t, "", 4096)
	m, err := decodeMetadata(tmeta)
	require.NoError(t, err)
	require.Len(t, m.Key, 64, "without a token the metadata carries the data key")
	tr, err := rt.Registry().Get(Name)
	require.NoError(t, err)
	secret := tr.(*Transport).srv.h.RuntimeSecret()
	assert.NotContains(t, m.Key, secret, "the key is derived from the secret, not the secret")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	got, err := RequestRange(ctx, "", tmeta, 0, 0, 4096)
	require.NoError(t, err, "the metadata's key opens the port")
	assert.Equal(t, want, got)

	// An HMAC over an empty key, as every runtime accepted before, and a
	// wrong key are refused, whatever the caller knows about the object.
	_, err = RequestRange(ctx, "", withoutKey(t, tmeta), 0, 0, 4096)
	require.Error(t, err, "the metadata without its key is refused")
	assert.Equal(t, transport.ErrPermissionDenied, transport.StatusOf(err), "%v", err)
	assert.Contains(t, err.Error(), "takes only the key inside its refs")
	wrong := *m
	wrong.Key = strings.Repeat("0", 64)
	_, err = RequestRange(ctx, "", wrong.encode(), 0, 0, 4096)
	assert.Equal(t, transport.ErrPermissionDenied, transport.StatusOf(err), "%v", err)
	_, err = RequestRange(ctx, secret, withoutKey(t, tmeta), 0, 0, 4096)
	assert.Equal(t, transport.ErrPermissionDenied, transport.StatusOf(err), "the runtime's secret itself is not the data key: %v", err)
}

func TestWithATokenTheMetadataCarriesNoKey(t *testing.T) {
	_, tmeta, want := runtimeObject(t, "shared-token", 100)
	m, err := decodeMetadata(tmeta)
	require.NoError(t, err)
	assert.Empty(t, m.Key, "receivers prove their own token")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	got, err := RequestRange(ctx, "shared-token", tmeta, 0, 0, 100)
	require.NoError(t, err)
	assert.Equal(t, want, got)
	_, err = RequestRange(ctx, "", tmeta, 0, 0, 100)
	assert.Equal(t, transport.ErrPermissionDenied, transport.StatusOf(err), "%v", err)
}

// A flood of wrong keys writes a line a second, not a line a connection.
func TestWrongKeyFloodLogsAFewLines(t *testing.T) {
	p := newPair(t, "", "")
	p.host.LogLevel = transport.LogWarn
	meta, _ := p.put(t, 40, 64)
	r, w, err := os.Pipe()
	require.NoError(t, err)
	stderr := os.Stderr
	os.Stderr = w
	var logged []byte
	done := make(chan struct{})
	go func() { logged, _ = io.ReadAll(r); close(done) }()
	const tries = 100
	start := time.Now()
	for i := 0; i < tries; i++ {
		_, err := RequestRange(context.Background(), "", withoutKey(t, meta), 0, 0, 64)
		if transport.StatusOf(err) != transport.ErrPermissionDenied {
			os.Stderr = stderr
			t.Fatalf("try %d: %v", i, err)
		}
	}
	elapsed := time.Since(start)
	os.Stderr = stderr
	w.Close()
	<-done
	lines := strings.Count(string(logged), "refused")
	t.Logf("%d wrong keys in %v: %d lines:\n%s", tries, elapsed.Round(time.Millisecond), lines, logged)
	assert.GreaterOrEqual(t, lines, 1, "the first refusal is logged")
	assert.LessOrEqual(t, lines, 2+int(elapsed/time.Second), "at most a line a second")
	assert.NotContains(t, string(logged), p.src.srv.key, "the key is never logged")
}

// probeEnv carries the metadata to TestCrossUserProbe in a child process.
const probeEnv = "RDT_TCP_PROBE_META"

// TestCrossUserProbe is the child of TestAnotherUserCannotReadTheDataPort:
// it runs as another user and tries to read 16 bytes of the object.
func TestCrossUserProbe(t *testing.T) {
	hexMeta := os.Getenv(probeEnv)
	if hexMeta == "" {
		t.Skip("run as a child by TestAnotherUserCannotReadTheDataPort")
	}
	tmeta, err := hex.DecodeString(hexMeta)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	got, err := RequestRange(ctx, "", tmeta, 0, 0, 16)
	fmt.Printf("PROBE uid=%d status=%s bytes=%x\n", os.Getuid(), transport.StatusOf(err), got)
}

// TestAnotherUserCannotReadTheDataPort: a process of another user that
// knows the data endpoint and the object id (but not the key from the
// ref) is refused; given the key it reads, so it is the key that keeps it
// out, not the network.
func TestAnotherUserCannotReadTheDataPort(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root to run a child as uid 65534 (nobody)")
	}
	setpriv, err := exec.LookPath("setpriv")
	if err != nil {
		t.Skip("needs setpriv (util-linux) to run a child as uid 65534")
	}
	_, tmeta, want := runtimeObject(t, "", 4096)
	// The test binary may sit in a directory only root can enter.
	dir, err := os.MkdirTemp("", "rdt-tcp-probe-")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	require.NoError(t, os.Chmod(dir, 0o755))
	bin := filepath.Join(dir, "probe.test")
	copyFile(t, os.Args[0], bin, 0o755)

	probe := func(tmeta []byte) string {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		cmd := exec.CommandContext(ctx, setpriv, "--reuid", "65534", "--regid", "65534", "--clear-groups",
			bin, "-test.run", "^TestCrossUserProbe$", "-test.v")
		cmd.Dir = dir
		cmd.Env = []string{"PATH=/usr/bin:/bin", "HOME=" + dir, probeEnv + "=" + hex.EncodeToString(tmeta)}
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "%s", out)
		for _, line := range strings.Split(string(out), "\n") {
			if strings.HasPrefix(line, "PROBE ") {
				return line
			}
		}
		t.Fatalf("the probe said nothing: %s", out)
		return ""
	}
	refused := probe(withoutKey(t, tmeta))
	assert.Contains(t, refused, "uid=65534 ")
	assert.Contains(t, refused, "status=RDT_ERR_PERMISSION_DENIED", "without the key the other user is refused")
	allowed := probe(tmeta)
	assert.Contains(t, allowed, "status=RDT_OK bytes="+hex.EncodeToString(want[:16]), "the port is reachable from that user")
}

func copyFile(t *testing.T, from, to string, mode os.FileMode) {
	src, err := os.Open(from)
	require.NoError(t, err)
	defer src.Close()
	dst, err := os.OpenFile(to, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, mode)
	require.NoError(t, err)
	_, err = io.Copy(dst, src)
	require.NoError(t, err)
	require.NoError(t, dst.Close())
}
