package shm

import (
	"bufio"
	"context"
	"encoding/hex"
	"io"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/rdt-project/rdt/core/transport"
	"github.com/rdt-project/rdt/core/transport/transporttest"
)

// The test runs in child processes, since it exhausts a process's own
// descriptor limit, which no other test may share: the receiver (which also
// owns an object of its own) and a separate source.
const fdTestRole = "RDT_SHM_TEST_FD_ROLE"

// A process out of descriptors gets a transport error that says so, never
// UNSUPPORTED: on the source (memfd_create, and handing a segment out) and on
// the receiver (connecting, and receiving the segment's descriptor). Once
// descriptors are free again everything works.
func TestOutOfDescriptorsIsATransportError(t *testing.T) {
	switch os.Getenv(fdTestRole) {
	case "receiver":
		outOfDescriptors(t)
		return
	case "source":
		serveOneObject(t)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^"+t.Name()+"$", "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(), fdTestRole+"=receiver")
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "child:\n%s", out)
	assert.Contains(t, string(out), "--- PASS: "+t.Name())
}

const fdTestSeed = 5

// fdTestBytes: objects this large travel as descriptors, not inline.
const fdTestBytes = inlineMax + 4096

// serveOneObject stages an object, prints its metadata, and serves it until
// its stdin closes.
func serveOneObject(t *testing.T) {
	src := newSegmentTransport(t)
	meta, _ := stageObject(t, src, fdTestSeed, fdTestBytes)
	os.Stdout.WriteString("META " + hex.EncodeToString(meta) + "\n")
	io.Copy(io.Discard, os.Stdin)
}

// startSource runs serveOneObject in another process and returns the
// object's metadata and bytes, and the process's pid.
func startSource(t *testing.T) ([]byte, []byte, int) {
	cmd := exec.Command(os.Args[0], "-test.run=^"+t.Name()+"$", "-test.count=1")
	cmd.Env = append(os.Environ(), fdTestRole+"=source")
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		stdin.Close()
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-done
		}
	})
	lines := bufio.NewScanner(stdout)
	for lines.Scan() {
		if h, ok := strings.CutPrefix(lines.Text(), "META "); ok {
			meta, err := hex.DecodeString(h)
			require.NoError(t, err)
			want := make([]byte, fdTestBytes)
			transporttest.Fill(want, fdTestSeed)
			return meta, want, cmd.Process.Pid
		}
	}
	t.Fatalf("the source process printed no metadata (%v)", lines.Err())
	return nil, nil, 0
}

func outOfDescriptors(t *testing.T) {
	remoteMeta, remoteWant, remotePid := startSource(t)
	local, viaKept, fresh := newSegmentTransport(t), newTransport(t), newTransport(t)
	localMeta, localWant := stageObject(t, local, 1, fdTestBytes) // its segment server listens now
	// viaKept keeps a connection to each segment server from here on.
	for _, c := range []struct {
		meta, want []byte
		pid        int
	}{{remoteMeta, remoteWant, remotePid}, {localMeta, localWant[0], os.Getpid()}} {
		got, err := fetchFrom(t, viaKept, c.meta, c.pid, fdTestBytes)
		require.NoError(t, err)
		require.Equal(t, [][]byte{c.want}, got)
	}
	_, x := transporttest.Buffer(t, fdTestBytes)

	var limit unix.Rlimit
	require.NoError(t, unix.Getrlimit(unix.RLIMIT_NOFILE, &limit))
	low := limit
	low.Cur = min(limit.Cur, 512)
	require.NoError(t, unix.Setrlimit(unix.RLIMIT_NOFILE, &low))
	// exhaust takes every free descriptor; a failed request may close a
	// connection and free one, so each check below starts with it.
	var filler []int
	exhaust := func() {
		t.Helper()
		for {
			fd, err := unix.Open("/dev/null", unix.O_RDONLY|unix.O_CLOEXEC, 0)
			if err != nil {
				require.ErrorIs(t, err, unix.EMFILE)
				return
			}
			filler = append(filler, fd)
			require.Less(t, len(filler), 4096, "the descriptor limit was not lowered")
		}
	}
	freeAll := func() {
		for _, fd := range filler {
			unix.Close(fd)
		}
		filler = nil
	}
	defer freeAll()

	outOfFDs := func(err error, where string) {
		t.Helper()
		assert.Equal(t, transport.ErrTransport, transport.StatusOf(err), "%v", err)
		assert.ErrorContains(t, err, where)
		assert.ErrorContains(t, err, "out of file descriptors")
	}
	exhaust()
	_, err := local.ExtractMetadata(transport.ObjectID{2}, []transport.Tensor{x})
	outOfFDs(err, "memfd_create: this process")
	exhaust()
	_, err = fetch(t, viaKept, localMeta, fdTestBytes)
	outOfFDs(err, "handing out the segment: the owner")
	exhaust()
	_, err = fetchFrom(t, viaKept, remoteMeta, remotePid, fdTestBytes)
	outOfFDs(err, "receiving the segment: this process")
	exhaust()
	_, err = fetchFrom(t, fresh, remoteMeta, remotePid, fdTestBytes)
	outOfFDs(err, "connecting to the owner's segment server: this process")

	freeAll()
	require.NoError(t, unix.Setrlimit(unix.RLIMIT_NOFILE, &limit))
	_, err = local.ExtractMetadata(transport.ObjectID{2}, []transport.Tensor{x})
	require.NoError(t, err)
	for _, tr := range []*Transport{viaKept, fresh} {
		got, err := fetchFrom(t, tr, remoteMeta, remotePid, fdTestBytes)
		require.NoError(t, err)
		assert.Equal(t, [][]byte{remoteWant}, got)
	}
}
