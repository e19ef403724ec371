"""Several hosts on one machine: a test bed of real network stacks.

Each host is a set of namespaces held by one keeper process:

- its own network namespace, with one interface (``eth0``, an address in
  198.18.0.0/15) whose other end is on the bed's bridge: the host's link;
- its own mount namespace, with private tmpfs on ``/tmp`` and ``/dev/shm``
  (the paths a caller names are bound back in), so that no socket or file
  joins two hosts;
- its own pid namespace, with the keeper as its init: killing the keeper
  kills every process of the host at once, as losing the machine would.

rdt takes a host's identity from the kernel's boot id and its pid and mount
namespaces, so processes on one bed host share cma and shm, and processes on
two hosts can only meet over their links.

A link's rate is set with ``tbf`` on both ends (each direction limited);
taking the bridge end down partitions the host: packets are dropped, no
reset is sent. Everything is torn down when the bed closes, even after a
failure: the keepers die (and with them every host process and both ends
of every link), then the bridge goes. A keeper also dies when the process
that made the bed dies (it reads a pipe only that process holds), and a
bed removes the bridges of beds whose makers are gone.

Needs root and the ``ip``, ``tc``, ``unshare``, ``nsenter`` and ``bash`` tools:
``Bed.unavailable()`` says why a bed cannot be made here.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import time
from typing import Dict, IO, List, Optional, Sequence

# The benchmarking range (RFC 2544); a bed uses nothing else.
NETWORK = "198.18.0"
PREFIX = 24
MAX_HOSTS = 200
_ALIAS = "rdt-test-bed pid="

# Run by each keeper inside its new namespaces: private /tmp and /dev/shm
# with the caller's paths bound back in (through descriptors opened before
# /tmp is covered), loopback up, then "ready", then wait for the pipe from
# the bed's maker to close.
_KEEPER = r"""
set -eu
n=0
for p in "$@"; do eval "exec $((n + 10))<\"\$p\""; n=$((n + 1)); done
mount -t tmpfs -o mode=1777 rdt-bed-tmp /tmp
mount -t tmpfs -o mode=1777 rdt-bed-shm /dev/shm
n=0
for p in "$@"; do
  mkdir -p "$p"
  mount -c --bind "/proc/self/fd/$((n + 10))" "$p"
  eval "exec $((n + 10))<&-"
  n=$((n + 1))
done
ip link set lo up
echo ready
exec cat >/dev/null
"""


class BedError(RuntimeError):
    pass


def _run(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    p = subprocess.run(list(args), capture_output=True, text=True)
    if check and p.returncode != 0:
        raise BedError(f"{' '.join(args)}: exit {p.returncode}: {p.stderr.strip()}")
    return p


class HostProcess:
    """A process started on a host. ``proc`` is the local handle of the
    ``nsenter`` that started it (its pipes are the process's own); ``pid``
    is the process itself, as this machine's root namespace sees it."""

    def __init__(self, proc: subprocess.Popen, host: "Host") -> None:
        self.proc = proc
        self.host = host
        self._pid: Optional[int] = None

    @property
    def stdin(self) -> IO[str]:
        assert self.proc.stdin is not None
        return self.proc.stdin

    @property
    def stdout(self) -> IO[str]:
        assert self.proc.stdout is not None
        return self.proc.stdout

    @property
    def pid(self) -> int:
        """The process's pid (nsenter forks it into the host's pid namespace)."""
        if self._pid is None:
            deadline = time.monotonic() + 10
            path = f"/proc/{self.proc.pid}/task/{self.proc.pid}/children"
            while True:
                try:
                    with open(path) as f:
                        kids = f.read().split()
                except FileNotFoundError:
                    raise BedError("the process on the host already ended") from None
                if kids:
                    self._pid = int(kids[0])
                    break
                if time.monotonic() > deadline:
                    raise BedError("nsenter started no process on the host")
                time.sleep(0.01)
        return self._pid

    def kill(self, sig: int = signal.SIGKILL) -> None:
        try:
            os.kill(self.pid, sig)
        except (ProcessLookupError, BedError):
            pass

    def wait(self, timeout: Optional[float] = None) -> int:
        return self.proc.wait(timeout)


class Host:
    """One host of a bed: ``address`` on its link, ``run`` and ``spawn``
    to start processes there."""

    def __init__(self, bed: "Bed", index: int) -> None:
        self.bed = bed
        self.index = index
        self.name = f"h{index}"
        self.address = f"{NETWORK}.{index + 1}"
        self.link = f"rdt{bed.tag}l{index}"  # the bridge's end of the host's link
        self.keeper: Optional[subprocess.Popen] = None
        self.processes: List[HostProcess] = []

    def __repr__(self) -> str:
        return f"<bed host {self.name} {self.address}>"

    def _start(self, keep: Sequence[str]) -> None:
        # The pipe to the keeper's stdin is this process's alone: when it
        # goes, the keeper reads EOF and ends, and the host with it.
        self.keeper = subprocess.Popen(
            ["unshare", "--net", "--mount", "--propagation", "private", "--pid", "--fork", "--mount-proc",
             "bash", "-c", _KEEPER, "keeper", *keep],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            pass_fds=(), start_new_session=True)
        assert self.keeper.stdout is not None
        line = self.keeper.stdout.readline()
        if line.strip() != "ready":
            err = self.keeper.stderr.read() if self.keeper.stderr else ""
            raise BedError(f"host {self.name} did not start: {line.strip()} {err.strip()}")

    @property
    def init_pid(self) -> int:
        """The host's init (the keeper's shell, as the root namespace sees it)."""
        assert self.keeper is not None
        with open(f"/proc/{self.keeper.pid}/task/{self.keeper.pid}/children") as f:
            return int(f.read().split()[0])

    def _enter(self) -> List[str]:
        return ["nsenter", "-t", str(self.init_pid), "-p", "-m", "-n", f"--wd={os.getcwd()}", "--"]

    def env(self, extra: Optional[Dict[str, str]] = None) -> Dict[str, str]:
        """The environment of a host process: this one's, without the
        directories that would point two hosts at one place."""
        env = {k: v for k, v in os.environ.items() if k not in ("XDG_RUNTIME_DIR", "TMPDIR", "RDT_SOCKET_DIR")}
        env["RDT_TEST_BED_HOST"] = self.name
        env.update(extra or {})
        return env

    def spawn(self, args: Sequence[str], env: Optional[Dict[str, str]] = None, **popen) -> HostProcess:
        """Starts args on this host, pipes for stdin and stdout (text, line
        buffered) unless popen says otherwise; stderr is inherited."""
        popen.setdefault("stdin", subprocess.PIPE)
        popen.setdefault("stdout", subprocess.PIPE)
        popen.setdefault("text", True)
        popen.setdefault("bufsize", 1)
        p = HostProcess(subprocess.Popen(self._enter() + list(args), env=self.env(env), **popen), self)
        self.processes.append(p)
        return p

    def run(self, args: Sequence[str], env: Optional[Dict[str, str]] = None, timeout: float = 120,
            check: bool = True) -> subprocess.CompletedProcess:
        """Runs args on this host to the end; output captured as text."""
        p = subprocess.run(self._enter() + list(args), env=self.env(env), capture_output=True, text=True,
                           timeout=timeout)
        if check and p.returncode != 0:
            raise BedError(f"{self.name}: {' '.join(args)}: exit {p.returncode}:\n{p.stdout}\n{p.stderr}")
        return p

    def kill_all(self) -> None:
        """Kills every process of the host at once (its init dies, and the
        kernel kills the rest of its pid namespace): the host is lost. Its
        link and addresses go with it; a bed does not restart a host."""
        if self.keeper is not None and self.keeper.poll() is None:
            try:
                os.kill(self.init_pid, signal.SIGKILL)
            except (ProcessLookupError, FileNotFoundError, IndexError):
                pass
            self.keeper.kill()
            self.keeper.wait(10)


class Bed:
    """``with Bed(3, rate="10gbit") as bed:`` three hosts on one bridge,
    each link limited to 10 Gbit/s each way (None: no limit)."""

    def __init__(self, hosts: int, rate: Optional[str] = None, keep: Sequence[str] = ()) -> None:
        if not 1 <= hosts <= MAX_HOSTS:
            raise ValueError(f"a bed has 1 to {MAX_HOSTS} hosts, not {hosts}")
        self.tag = secrets.token_hex(2)
        self.bridge = f"rdt{self.tag}br"
        self.hosts = [Host(self, i) for i in range(hosts)]
        self.rate = rate
        # Paths every host sees as this process does: the working directory
        # (the repository), the interpreter's prefix and whatever was asked.
        self.keep = sorted({os.getcwd(), sys.prefix, *map(os.path.abspath, keep)})

    @staticmethod
    def unavailable() -> Optional[str]:
        """Why no bed can be made here, or None."""
        if os.geteuid() != 0:
            return "the host test bed needs root (network, mount and pid namespaces)"
        for tool in ("ip", "tc", "unshare", "nsenter", "bash"):
            if shutil.which(tool) is None:
                return f"the host test bed needs the {tool} tool"
        return None

    def __enter__(self) -> "Bed":
        why = self.unavailable()
        if why:
            raise BedError(why)
        try:
            self._up()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _up(self) -> None:
        _remove_orphans()
        _run("ip", "link", "add", self.bridge, "type", "bridge")
        _run("ip", "link", "set", self.bridge, "alias", f"{_ALIAS}{os.getpid()}")
        _run("ip", "link", "set", self.bridge, "up")
        for h in self.hosts:
            h._start(self.keep)
            pid = str(h.init_pid)
            inside = f"rdt{self.tag}i{h.index}"
            _run("ip", "link", "add", h.link, "type", "veth", "peer", "name", inside)
            _run("ip", "link", "set", inside, "netns", pid)
            _run("ip", "link", "set", h.link, "master", self.bridge)
            _run("ip", "link", "set", h.link, "up")
            _run("nsenter", "-t", pid, "-n", "ip", "link", "set", inside, "name", "eth0")
            _run("nsenter", "-t", pid, "-n", "ip", "addr", "add", f"{h.address}/{PREFIX}", "dev", "eth0")
            _run("nsenter", "-t", pid, "-n", "ip", "link", "set", "eth0", "up")
            if self.rate:
                self.set_rate(h, self.rate)

    def set_rate(self, host: Host, rate: Optional[str]) -> None:
        """Limits host's link to rate ("100mbit", "10gbit") each way; None
        lifts the limit."""
        for prefix, dev in (([], host.link), (_inside(host), "eth0")):
            _run(*prefix, "tc", "qdisc", "del", "dev", dev, "root", check=False)
            if rate:
                # A burst of 1 MiB (at least rate/HZ, as tbf needs) and up to
                # 50 ms of queue: a link that paces, not one that drops.
                _run(*prefix, "tc", "qdisc", "add", "dev", dev, "root", "tbf", "rate", rate, "burst", "1mb",
                     "latency", "50ms")

    def link_bytes(self, host: Host, towards: bool = True) -> int:
        """Bytes host's link has carried so far towards the host (or from
        it): a way to see that a transfer is under way."""
        counter = "tx_bytes" if towards else "rx_bytes"  # as the bridge's end counts them
        with open(f"/sys/class/net/{host.link}/statistics/{counter}") as f:
            return int(f.read())

    def wait_traffic(self, host: Host, nbytes: int, towards: bool = True, timeout: float = 120) -> None:
        """Returns once host's link has carried nbytes more towards the
        host (or from it), so that a cut lands inside a transfer however
        slowly the machine got it started."""
        start = self.link_bytes(host, towards)
        deadline = time.monotonic() + timeout
        while self.link_bytes(host, towards) - start < nbytes:
            if time.monotonic() > deadline:
                raise BedError(f"{host.name}'s link carried under {nbytes} bytes in {timeout} s")
            time.sleep(0.01)

    def link_down(self, host: Host) -> None:
        """Cuts host off: its link drops every packet, no reset is sent."""
        _run("ip", "link", "set", host.link, "down")

    def link_up(self, host: Host) -> None:
        _run("ip", "link", "set", host.link, "up")

    def unresolved_neighbour(self, host: Host, peer: Host, hold: float) -> None:
        """Leaves host's neighbour entry for peer as a partition can leave
        it: being resolved, its one probe lost. For hold seconds every packet
        host sends to peer waits on the entry; then the entry fails, and so
        does every connection attempt waiting on it, with "no route to host",
        also one made after the link came back. Call it while host's link is
        down.

        How: the kernel dropped host's neighbour entries when its link went
        down. Host is made to probe once per resolution (mcast_solicit 1)
        and to give the probe hold seconds (retrans_time_ms); then one
        datagram to peer starts a resolution whose probe the cut link drops.
        Peer gets a permanent entry for host, so that no request of its own
        (which names host's address) resolves host's entry early: what
        happens is up to host's entry alone. The settings stay for the
        bed's life."""
        mac = re.search(r"link/ether (\S+)", _run(*_inside(host), "ip", "-o", "link", "show", "eth0").stdout)
        if mac is None:
            raise BedError(f"{host.name}'s eth0 has no link address")
        _run(*_inside(peer), "ip", "neigh", "replace", host.address, "lladdr", mac.group(1), "dev", "eth0",
             "nud", "permanent")
        _run(*_inside(host), "sysctl", "-q", "-w", "net.ipv4.neigh.eth0.mcast_solicit=1",
             f"net.ipv4.neigh.eth0.retrans_time_ms={round(hold * 1000)}")
        _run(*_inside(host), "ip", "neigh", "flush", "dev", "eth0")
        _run(*_inside(host), sys.executable, "-c",
             "import socket, sys; socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b'', (sys.argv[1], 9))",
             peer.address)
        state = _run(*_inside(host), "ip", "neigh", "show", "to", peer.address, "dev", "eth0").stdout
        if "INCOMPLETE" not in state:
            raise BedError(f"{host.name}'s neighbour entry for {peer.address} is not being resolved: {state.strip()!r}")

    def close(self) -> None:
        for h in self.hosts:
            try:
                h.kill_all()
            except Exception:
                pass
            for p in h.processes:
                if p.proc.poll() is None:
                    p.proc.kill()
                try:
                    p.proc.wait(10)
                except subprocess.TimeoutExpired:
                    pass
            # The kernel frees a dead namespace's devices in the background:
            # remove each link's end here (and with it the other) now.
            _run("ip", "link", "del", h.link, check=False)
        _run("ip", "link", "del", self.bridge, check=False)


def _inside(host: Host) -> List[str]:
    """The command prefix that runs a tool in host's network namespace."""
    return ["nsenter", "-t", str(host.init_pid), "-n"]


def _remove_orphans() -> None:
    """Removes the bridges and links of beds whose makers are gone (killed
    before they could close): their hosts went with the makers' pipes."""
    out = _run("ip", "-o", "link", "show", "type", "bridge", check=False).stdout
    gone = []
    for line in out.splitlines():
        if _ALIAS not in line:
            continue
        name = line.split(":")[1].strip().split("@")[0]
        pid = line.split(_ALIAS)[1].split()[0]
        if pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
            gone.append(name[:-len("br")])  # "rdt<tag>": every link of that bed starts so
    if not gone:
        return
    for line in _run("ip", "-o", "link", check=False).stdout.splitlines():
        name = line.split(":")[1].strip().split("@")[0]
        if any(name.startswith(prefix) for prefix in gone):
            _run("ip", "link", "del", name, check=False)
