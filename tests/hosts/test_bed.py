"""The bed itself: hosts that share nothing but their links, links that
can be cut and slowed, and nothing left behind."""

import subprocess
import sys
import time

import pytest

from bed import Bed, BedError

PROBE = """
import errno, socket, sys
s = socket.socket()
s.settimeout(float(sys.argv[2]))
try:
    s.connect((sys.argv[1], int(sys.argv[3])))
    print("connected")
except OSError as e:
    print(errno.errorcode.get(e.errno) or type(e).__name__)
"""

LISTEN = """
import socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], 7000))
s.listen(8)
print("listening", flush=True)
while True:
    c, _ = s.accept()
    c.close()
"""


def probe(host, address, timeout=1.0):
    return host.run([sys.executable, "-c", PROBE, address, str(timeout), "7000"]).stdout.strip()


def serving_pair(make_bed):
    """A bed of two hosts, a listening on port 7000 and reached by b."""
    bed = make_bed(2)
    a, b = bed.hosts
    server = a.spawn([sys.executable, "-c", LISTEN, a.address])
    assert server.stdout.readline().strip() == "listening"
    assert probe(b, a.address) == "connected"
    return bed, a, b


def test_hosts_share_no_files_and_have_their_own_addresses(make_bed):
    bed = make_bed(2)
    a, b = bed.hosts
    assert (a.address, b.address) == ("198.18.0.1", "198.18.0.2")
    a.run(["sh", "-c", "echo mine > /tmp/only-on-a && mkdir -p /dev/shm/x"])
    # b's /tmp holds only the paths the bed binds back in (the repository,
    # when it lies under /tmp); /dev/shm nothing.
    kept = sorted({p.split("/")[2] for p in bed.keep if p.startswith("/tmp/")})
    assert b.run(["sh", "-c", "ls -A /tmp /dev/shm"]).stdout.split() == ["/dev/shm:", "/tmp:", *kept]
    assert a.run(["cat", "/tmp/only-on-a"]).stdout == "mine\n"
    assert "198.18.0.2/24" in b.run(["ip", "-o", "addr", "show", "dev", "eth0"]).stdout
    # Each host is its own pid namespace: it sees its own processes only.
    assert a.run(["sh", "-c", "ls /proc | grep -c '^[0-9]'"]).stdout.strip() in ("2", "3", "4")


def test_a_cut_link_drops_packets_and_a_healed_one_carries_them(make_bed):
    bed, a, b = serving_pair(make_bed)
    bed.link_down(b)
    # Dropped, not refused: the connect waits out its timeout.
    assert probe(b, a.address, 0.5) in ("timeout", "TimeoutError")
    bed.link_up(b)
    deadline = time.monotonic() + 10
    while probe(b, a.address) != "connected":
        assert time.monotonic() < deadline, "the healed link carried nothing"


def test_a_neighbour_left_unresolved_fails_the_first_connect_after_the_heal(make_bed):
    """What the fault tests that dial right after a heal rely on: the
    kernel fails the first connect with "no route to host" once the entry
    gives up, and the next connect resolves the address afresh."""
    bed, a, b = serving_pair(make_bed)
    bed.link_down(b)
    bed.unresolved_neighbour(b, a, hold=4.0)
    bed.link_up(b)
    assert probe(b, a.address, 30) == "EHOSTUNREACH"
    assert probe(b, a.address) == "connected"


def test_a_rate_limits_the_link(make_bed):
    bed = make_bed(2, rate="100mbit")
    a, b = bed.hosts
    # 16 MiB at 100 Mbit/s, less the bucket tbf starts with (1 MiB), takes
    # at least 1.26 s however fast the machine.
    send = ("import socket,sys,time;s=socket.create_connection((sys.argv[1],7001));t=time.monotonic();"
            "s.sendall(bytes(16<<20));s.shutdown(1);s.recv(1);print(time.monotonic()-t)")
    recv = ("import socket,sys;l=socket.socket();l.bind((sys.argv[1],7001));l.listen(1);print('up',flush=True);"
            "c,_=l.accept();n=0\nwhile True:\n d=c.recv(1<<20)\n if not d: break\n n+=len(d)\n"
            "c.send(b'k');print(n)")
    r = a.spawn([sys.executable, "-c", recv, a.address])
    assert r.stdout.readline().strip() == "up"
    seconds = float(b.run([sys.executable, "-c", send, a.address]).stdout)
    assert r.stdout.readline().strip() == str(16 << 20)
    assert seconds >= 1.2, seconds
    bed.set_rate(b, None)
    assert "tbf" not in b.run(["tc", "qdisc", "show", "dev", "eth0"]).stdout


def test_kill_all_ends_every_process_of_a_host(make_bed):
    bed = make_bed(1)
    (a,) = bed.hosts
    p = a.spawn(["sleep", "600"])
    q = a.spawn(["sh", "-c", "sleep 600 & wait"])
    a.kill_all()
    assert p.wait(10) != 0 and q.wait(10) != 0


def test_closing_the_bed_leaves_no_link_behind():
    if Bed.unavailable():
        pytest.skip(Bed.unavailable())
    with Bed(2) as bed:
        tag = bed.tag
        kept = bed.hosts[0].spawn(["sleep", "600"])
        assert tag in subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    assert kept.wait(10) != 0
    assert tag not in subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout


def test_a_bed_made_in_a_killed_process_is_removed_by_the_next():
    if Bed.unavailable():
        pytest.skip(Bed.unavailable())
    code = ("import sys,os;sys.path.insert(0,sys.argv[1]);from bed import Bed;b=Bed(1).__enter__();"
            "print(b.tag,flush=True);os.kill(os.getpid(),9)")
    out = subprocess.run([sys.executable, "-c", code, __file__.rsplit("/", 1)[0]], capture_output=True,
                         text=True).stdout.strip()
    assert out and out in subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    with Bed(1):
        pass
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    assert f"rdt{out}" not in links


def test_a_bed_needs_a_sane_size():
    with pytest.raises(ValueError):
        Bed(0)
    with pytest.raises(ValueError):
        Bed(1000)
    assert issubclass(BedError, RuntimeError)
