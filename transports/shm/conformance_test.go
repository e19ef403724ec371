package shm

import (
	"os"
	"testing"

	"github.com/rdt-project/rdt/core/transport"
	"github.com/rdt-project/rdt/core/transport/transporttest"
)

var conformance = transporttest.Config{
	New:         newForSuite,
	Decode:      func(b []byte) error { _, err := decodeMetadata(b); return err },
	FreedStatus: transport.ErrNotFound,
}

func TestMain(m *testing.M) { transporttest.Main(m, conformance) }

// The suite runs twice: with the arena (small objects staged in it), and
// with every object in a segment of its own. Its source processes learn
// which from the environment.
func TestConformance(t *testing.T) { transporttest.Run(t, conformance) }

func TestConformanceWithSegmentsOnly(t *testing.T) {
	t.Setenv(segmentsOnlyEnv, "1")
	transporttest.Run(t, conformance)
}

const segmentsOnlyEnv = "RDT_SHM_TEST_SEGMENTS_ONLY"

func newForSuite(h transport.Host) (transport.Transport, error) {
	if os.Getenv(segmentsOnlyEnv) == "1" {
		h = noArena{h}
	}
	return New(h)
}

// noArena is a host whose settings turn the arena off.
type noArena struct{ transport.Host }

func (h noArena) Settings() transport.Settings {
	return transport.NewSettings(map[string]string{arenaSetting.Name: "0"})
}
