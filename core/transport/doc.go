// Package transport is all a transport author reads: the Transport and
// Request interfaces a transport implements, the Host it may ask of its
// runtime, tensors, dtypes and devices, statuses and errors, ids and peer
// identities, logging, and the bounded wire reader and writer for metadata
// codecs. It imports no other package of the project; the engine
// (core/engine), the control plane (core/control) and every transport
// (transports/*) import it.
package transport
