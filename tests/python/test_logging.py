"""rdt's log lines reach Python's logging (logger "rdt"), not stderr, and
the level set from Python governs what the core logs. Each case runs in a
fresh interpreter: the capture starts when the library loads, once per
process."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.timeout(120)

# Two runtimes of one process: a fetch that works (a debug line) and a
# fetch from an owner that is gone (a warning), every record collected as JSON.
SCRIPT = textwrap.dedent("""
    import json, logging, sys
    import numpy as np, rdt

    class Collect(logging.Handler):
        def __init__(self):
            super().__init__(logging.DEBUG)
            self.records = []
        def emit(self, r):
            self.records.append({"logger": r.name, "level": r.levelname, "message": r.getMessage(),
                                 "runtime": getattr(r, "rdt_runtime", None), "created": r.created})

    handler = Collect()
    logging.getLogger("rdt").addHandler(handler)
    logging.getLogger("rdt").propagate = False
    {setup}
    src, dst = rdt.Runtime("src"), rdt.Runtime("dst")
    ref = src.put(np.arange(4.0))
    blob = ref.serialize()
    assert dst.get(dst.deserialize(blob)).tolist() == [0.0, 1.0, 2.0, 3.0]
    orphan = dst.deserialize(src.put(np.arange(3.0)).serialize())
    src.close()  # the owner is gone: the fetch fails, with a warning
    try:
        dst.get(orphan, timeout=10)
    except rdt.RdtError as e:
        print("fetch failed:", type(e).__name__, file=sys.stderr)
    src.close(); dst.close()
    rdt._process.PROCESS.shutdown()  # what exit does: the last lines are taken
    json.dump(handler.records, sys.stdout)
""")


def run(setup="", env=None):
    e = dict(os.environ)
    e.pop("RDT_LOG", None)
    e.update(env or {})
    p = subprocess.run([sys.executable, "-c", SCRIPT.replace("{setup}", setup)], capture_output=True,
                       text=True, timeout=90, env=e)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout), p.stderr


def test_lines_arrive_through_logging_at_the_level_set_from_python():
    records, stderr = run('rdt.set_log_level("debug")')
    assert all(r["logger"] == "rdt" for r in records)
    fetched = [r for r in records if r["level"] == "DEBUG" and "fetched object" in r["message"]]
    assert fetched and fetched[0]["runtime"] == "dst" and fetched[0]["message"].startswith("dst: ")
    failed = [r for r in records if r["level"] == "WARNING" and "failed" in r["message"]]
    assert failed, records
    assert any("destroyed" in r["message"] for r in records)  # logged while the runtimes closed
    # Nothing went to stderr the C way ("hh:mm:ss rdt[name] level: ...").
    assert "rdt[" not in stderr, stderr


def test_default_level_is_warn_and_a_logger_level_set_before_loading_counts():
    records, _ = run()
    assert records and {r["level"] for r in records} == {"WARNING"}, records
    records, _ = run('logging.getLogger("rdt").setLevel(logging.DEBUG)')
    assert any(r["level"] == "DEBUG" for r in records)


def test_error_level_silences_the_warning_and_off_silences_everything():
    records, stderr = run('rdt.set_log_level("error")')
    assert records == [] and "rdt[" not in stderr
    records, _ = run('rdt.set_log_level(logging.CRITICAL + 10)')
    assert records == []


def test_rdt_log_stderr_keeps_the_c_behaviour():
    records, stderr = run('rdt.set_log_level("debug")', env={"RDT_LOG_STDERR": "1"})
    assert records == []
    assert "rdt[dst] debug: fetched object" in stderr


def test_bad_levels_are_refused():
    import rdt
    with pytest.raises(ValueError):
        rdt.set_log_level("loud")
    with pytest.raises(TypeError):
        rdt.set_log_level(1.5)


# A program that configures no logging, whose fetch from a gone owner fails.
UNCONFIGURED = textwrap.dedent("""
    import logging, sys
    import numpy as np, rdt
    {setup}
    src, dst = rdt.Runtime("src"), rdt.Runtime("dst")
    orphan = dst.deserialize(src.put(np.arange(3.0)).serialize())
    print(orphan.id, flush=True)
    src.close()
    try:
        dst.get(orphan, timeout=10)
    except rdt.PeerUnavailableError as e:
        print(e, file=sys.stderr)
    dst.close()
    rdt._process.PROCESS.shutdown()  # the last lines are taken
""")


def test_an_unconfigured_program_sees_a_failed_fetch_once():
    def run(setup):
        e = dict(os.environ)
        e.pop("RDT_LOG", None)
        p = subprocess.run([sys.executable, "-c", UNCONFIGURED.replace("{setup}", setup)], capture_output=True,
                           text=True, timeout=90, env=e)
        assert p.returncode == 0, p.stderr
        return p.stderr.count(p.stdout.strip())  # the object id: in each message about the fetch
    assert run("") == 1  # the exception alone, not logging's last resort printing the warning too
    assert run("logging.basicConfig()") == 2  # configured: the warning reaches its handler as well
