"""Huge pages for XLA's CPU buffers (scalerl_jax/hostmem.py): when a ``python -m`` command restarts with glibc's
huge-page tunable, that the restart keeps the command and its arguments, that nothing else restarts, and that the
tunable does what it is there for: far fewer page faults per train-sized call."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from scalerl_jax import hostmem

ROOT = Path(__file__).resolve().parents[1]
LIVE = hostmem.glibc_supports_hugetlb() and hostmem.thp_mode() in ("always", "madvise")


def test_environment_to_restart_with():
    base = {"PATH": "/bin"}
    env = hostmem.hugepage_env(base, supported=True, thp="madvise")
    assert env == {"PATH": "/bin", "GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"}
    assert base == {"PATH": "/bin"}  # the caller's mapping is not changed
    # a user's own tunables are kept, the huge-page one appended
    env = hostmem.hugepage_env({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"}, supported=True, thp="always")
    assert env["GLIBC_TUNABLES"] == "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1"
    # nothing to do: already set (either value), opted out, not glibc 2.35+, or the kernel's THP off / unknown
    assert hostmem.hugepage_env({"GLIBC_TUNABLES": "glibc.malloc.hugetlb=0"}, supported=True, thp="always") is None
    assert hostmem.hugepage_env({"SCALERL_HUGEPAGES": "0"}, supported=True, thp="always") is None
    assert hostmem.hugepage_env({}, supported=False, thp="always") is None
    assert hostmem.hugepage_env({}, supported=True, thp="never") is None
    assert hostmem.hugepage_env({}, supported=True, thp=None) is None


def test_thp_mode_reads_the_bracketed_word(tmp_path):
    f = tmp_path / "enabled"
    f.write_text("always [madvise] never\n")
    assert hostmem.thp_mode(str(f)) == "madvise"
    f.write_text("[always] madvise never\n")
    assert hostmem.thp_mode(str(f)) == "always"
    assert hostmem.thp_mode(str(tmp_path / "missing")) is None


def _probe_package(tmp_path: Path) -> Path:
    """A package laid out like ours (its __init__ calls reexec_for_cli) with a module that reports its process."""
    pkg = tmp_path / "probe_pkg"
    pkg.mkdir(exist_ok=True)
    (pkg / "__init__.py").write_text("from scalerl_jax.hostmem import reexec_for_cli\n\nreexec_for_cli()\n")
    (pkg / "show.py").write_text(textwrap.dedent("""
        import json, os, sys
        print("PROBE " + json.dumps({"tunables": os.environ.get("GLIBC_TUNABLES"), "argv": sys.argv[1:],
                                     "pid": os.getpid(), "ppid": os.getppid()}))
    """))
    return tmp_path


def _run(args: list[str], tmp_path: Path, **env_over) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("GLIBC_TUNABLES", hostmem.OPT_OUT)}
    env.update(env_over)
    env["PYTHONPATH"] = os.pathsep.join([str(_probe_package(tmp_path)), str(ROOT)])
    r = subprocess.run([sys.executable, *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    line = next(x for x in r.stdout.splitlines() if x.startswith("PROBE "))
    return json.loads(line[len("PROBE "):])


@pytest.mark.skipif(not LIVE, reason="needs glibc 2.35+ and the kernel's transparent huge pages (madvise/always)")
def test_python_m_restarts_with_the_tunable_and_keeps_its_arguments(tmp_path):
    out = _run(["-m", "probe_pkg.show", "a b", "--flag=1", ""], tmp_path)
    assert out["tunables"] == "glibc.malloc.hugetlb=1"
    assert out["argv"] == ["a b", "--flag=1", ""]


def test_imports_and_opt_out_do_not_restart(tmp_path):
    # imported from a script (argv[0] is not "-m"): never restarted, whatever the machine
    out = _run(["-c", "import probe_pkg.show"], tmp_path)
    assert out["tunables"] is None
    # python -m with SCALERL_HUGEPAGES=0: left as it is
    out = _run(["-m", "probe_pkg.show"], tmp_path, SCALERL_HUGEPAGES="0")
    assert out["tunables"] is None
    # a user's own GLIBC_TUNABLES that already chooses: kept as it is
    out = _run(["-m", "probe_pkg.show"], tmp_path, GLIBC_TUNABLES="glibc.malloc.hugetlb=0")
    assert out["tunables"] == "glibc.malloc.hugetlb=0"


_FAULTS = """
import json, resource
import jax, jax.numpy as jnp
# a train-step-sized temporary: [32768, 1024] float32 intermediates (128 MiB each) in every call
f = jax.jit(lambda x, w: jnp.tanh(jnp.tanh(jnp.tanh(x @ w) @ w.T) @ w).sum())
x, w = jnp.ones((32768, 128)), jnp.full((128, 1024), 0.01)
f(x, w).block_until_ready(); f(x, w).block_until_ready()
r0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(5):
    f(x, w).block_until_ready()
print("FAULTS " + json.dumps((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - r0) / 5))
"""


@pytest.mark.skipif(not LIVE, reason="needs glibc 2.35+ and the kernel's transparent huge pages (madvise/always)")
def test_the_tunable_cuts_page_faults_of_a_large_temporary():
    """The reason the tunable is set: a call whose temporaries exceed malloc's mmap threshold faults every 4 KiB page
    of them in again on each call without it; with it, whole 2 MiB pages."""
    def faults(tunables: str | None) -> float:
        env = {k: v for k, v in os.environ.items() if k not in ("GLIBC_TUNABLES", hostmem.OPT_OUT)}
        env["JAX_PLATFORMS"] = "cpu"
        if tunables:
            env["GLIBC_TUNABLES"] = tunables
        r = subprocess.run([sys.executable, "-c", _FAULTS], env=env, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr
        return json.loads(next(x for x in r.stdout.splitlines() if x.startswith("FAULTS ")).split(" ", 1)[1])

    plain, huge = faults(None), faults(hostmem.TUNABLE)
    # 128 MiB in 4 KiB pages is 32768 faults per buffer; in 2 MiB pages, 64 (plus the process's other faults)
    assert plain > 32768, plain
    assert huge < plain / 10, (plain, huge)
