"""flock-agent's console script: lazy library packages and the prompt exit (each in a fresh interpreter)."""

import subprocess
import sys

LAZY_IMPORT = """
import sys
from flock._entry import lazy_packages
lazy_packages()
import flock.agent._main
# The agent's imports ran no package __init__ of these; their names still resolve.
assert "urllib3.exceptions" not in sys.modules and "pyroute2.ndb" not in sys.modules
import urllib3, pyroute2
assert urllib3.util.make_headers(basic_auth="a:b") == {"authorization": "Basic YTpi"}  # a relative submodule
assert pyroute2.AsyncIPRoute.__name__ == "AsyncIPRoute"
try:
    urllib3.no_such_name
except AttributeError as exc:
    assert "no_such_name" in str(exc)
else:
    raise AssertionError("a missing name resolved")
print("ok")
"""


def run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)


def test_lazy_packages_resolve_names_and_submodules():
    proc = run(LAZY_IMPORT)
    assert proc.returncode == 0 and proc.stdout == "ok\n", proc.stderr


def test_exit_now_exits_like_sys_exit_with_output_flushed():
    proc = run("import logging; from flock._entry import exit_now; print('out', end=''); exit_now(3)")
    assert (proc.returncode, proc.stdout) == (3, "out")
    proc = run("from flock._entry import exit_now; print('out'); exit_now('flock-agent: bad flag')")
    assert (proc.returncode, proc.stdout, proc.stderr) == (1, "out\n", "flock-agent: bad flag\n")
    proc = run("from flock._entry import exit_now; exit_now(None)")
    assert proc.returncode == 0
