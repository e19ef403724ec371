package cma

import (
	"testing"

	"github.com/rdt-project/rdt/core/transport"
	"github.com/rdt-project/rdt/core/transport/transporttest"
)

var conformance = transporttest.Config{
	New:         New,
	Decode:      func(b []byte) error { _, err := decodeMetadata(b); return err },
	FreedStatus: transport.ErrPeerUnavailable,
	WriterLandsBytes: "cma writes with process_vm_writev into the owner's memory: the kernel's ptrace check, " +
		"not the owner's runtime, bounds what a writer touches",
}

func TestMain(m *testing.M) { transporttest.Main(m, conformance) }

func TestConformance(t *testing.T) { transporttest.Run(t, conformance) }
