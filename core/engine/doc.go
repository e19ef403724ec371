// Package engine is rdt's engine: runtimes, the object store, references
// and distributed reference counting, the transport registry, the fetch
// engine and groups. Runtimes talk to each other through the control plane
// in core/control; what a transport implements and uses lives in
// core/transport, which imports nothing of the project.
package engine
