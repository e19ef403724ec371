package nixl

import (
	"testing"

	"github.com/rdt-project/rdt/core/transport"
	"github.com/rdt-project/rdt/core/transport/transporttest"
)

var conformance = transporttest.Config{
	New:    New,
	Decode: func(b []byte) error { _, err := decodeMetadata(b); return err },
	// NIXL reports an agent that went away as a backend error: it cannot
	// tell that from other failures of the backend.
	SourceGoneStatus: transport.ErrTransport,
	WriterLandsBytes: "nixl writes with NIXL WRITE requests into the owner's registered memory: the owner's " +
		"runtime takes no part in them",
	Unavailable: func() string {
		if err := Load(); err != nil {
			return "NIXL is not available (set " + LibraryEnv + " to the libnixl_capi.so of the nixl wheel): " + err.Error()
		}
		return ""
	},
}

func TestMain(m *testing.M) { transporttest.Main(m, conformance) }

func TestConformance(t *testing.T) { transporttest.Run(t, conformance) }
