// Package core is the transport-independent heart of rdt: runtimes, the
// object store, references and distributed reference counting, the transport
// registry, the fetch engine and groups, and the control plane (the
// in-process and socket networks) runtimes talk over. What a transport
// implements and uses lives in core/transport, which core imports and which
// imports nothing of the project.
package core
