package engine

import (
	"os"
	"strings"
	"sync/atomic"

	"github.com/rdt-project/rdt/core/transport"
)

// identity is who a runtime is, to its peers and its transports.
type identity struct {
	id     transport.RuntimeID // derived from its identity key's public half
	name   string
	hostID string
	pid    int
	reg    *Registry // the transports it advertises
	// address is set once the endpoint listens; read by its goroutines.
	address atomic.Pointer[string]
}

// addr is the control-plane address peers reach the runtime at ("" until
// it listens).
func (me *identity) addr() string {
	if a := me.address.Load(); a != nil {
		return *a
	}
	return ""
}

// info describes the runtime to peers, with the transports it has now.
func (me *identity) info() transport.PeerInfo {
	return transport.PeerInfo{
		RuntimeID: me.id, Name: me.name, Address: me.addr(), HostID: me.hostID,
		Pid: me.pid, Transports: me.reg.Adverts(),
	}
}

// hostIdentity names the kernel instance and the namespaces that decide
// whether same-host transports apply: boot id, pid and mount namespaces.
func hostIdentity() string {
	boot, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		h, _ := os.Hostname()
		return "host:" + h
	}
	pidNS, _ := os.Readlink("/proc/self/ns/pid")
	mntNS, _ := os.Readlink("/proc/self/ns/mnt")
	return strings.TrimSpace(string(boot)) + "/" + pidNS + "/" + mntNS
}
