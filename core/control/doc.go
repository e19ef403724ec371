// Package control is rdt's control plane: how runtimes find, authenticate
// and talk to each other. A runtime offers a PeerService and reaches others
// as Peers through a Network: InProcess within one process, Sockets (Unix
// and TCP, framed messages behind an authenticated handshake) between
// processes and hosts. It imports only core/transport and knows nothing of
// the engine's objects beyond their ids.
package control
