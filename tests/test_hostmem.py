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
from tests.conftest import HANG_S

ROOT = Path(__file__).resolve().parents[1]
LIVE = hostmem.glibc_supports_hugetlb() and hostmem.thp_mode() in ("always", "madvise")


def test_tunables_to_restart_with():
    assert hostmem.hugepage_tunables({"PATH": "/bin"}, supported=True, thp="madvise") == "glibc.malloc.hugetlb=1"
    # a user's own tunables are kept, the huge-page one appended
    assert (hostmem.hugepage_tunables({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"}, supported=True, thp="always")
            == "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1")
    # nothing to do: already set (either value), opted out, not glibc 2.35+, or the kernel's THP off / unknown
    assert hostmem.hugepage_tunables({"GLIBC_TUNABLES": "glibc.malloc.hugetlb=0"}, supported=True, thp="always") is None
    assert hostmem.hugepage_tunables({"SCALERL_HUGEPAGES": "0"}, supported=True, thp="always") is None
    assert hostmem.hugepage_tunables({}, supported=False, thp="always") is None
    assert hostmem.hugepage_tunables({}, supported=True, thp="never") is None
    assert hostmem.hugepage_tunables({}, supported=True, thp=None) is None


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
    r = subprocess.run([sys.executable, *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=HANG_S)
    assert r.returncode == 0, r.stderr
    line = next(x for x in r.stdout.splitlines() if x.startswith("PROBE "))
    return json.loads(line[len("PROBE "):])


@pytest.mark.skipif(not LIVE, reason="needs glibc 2.35+ and the kernel's transparent huge pages (madvise/always)")
def test_python_m_restarts_with_the_tunable_and_keeps_its_arguments(tmp_path):
    out = _run(["-m", "probe_pkg.show", "a b", "--flag=1", ""], tmp_path)
    assert out["tunables"] == "glibc.malloc.hugetlb=1"
    assert out["argv"] == ["a b", "--flag=1", ""]


@pytest.mark.skipif(not LIVE, reason="needs glibc 2.35+ and the kernel's transparent huge pages (madvise/always)")
def test_a_console_script_restarts_with_the_tunable_and_another_script_does_not(tmp_path):
    """The installer's console scripts (``scalerl-run``, ...) run a file of that name that imports the entry point:
    the same restart as ``python -m``; a script of another name starting alike is left alone."""
    for name in ("scalerl-fit", "scalerl-notes.py"):
        (tmp_path / name).write_text("import probe_pkg.show\n")
    out = _run([str(tmp_path / "scalerl-fit"), "--out", "x y"], tmp_path)
    assert out["tunables"] == "glibc.malloc.hugetlb=1" and out["argv"] == ["--out", "x y"]
    assert _run([str(tmp_path / "scalerl-notes.py")], tmp_path)["tunables"] is None


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
        r = subprocess.run([sys.executable, "-c", _FAULTS], env=env, capture_output=True, text=True, timeout=HANG_S)
        assert r.returncode == 0, r.stderr
        return json.loads(next(x for x in r.stdout.splitlines() if x.startswith("FAULTS ")).split(" ", 1)[1])

    plain, huge = faults(None), faults(hostmem.TUNABLE)
    # 128 MiB in 4 KiB pages is 32768 faults per buffer; in 2 MiB pages, 64 (plus the process's other faults)
    assert plain > 32768, plain
    assert huge < plain / 10, (plain, huge)


_STEPS = """
import json
import jax, numpy as np
from scalerl_jax.experiments.presets import small_plan
from scalerl_jax.models.model import init_params
from scalerl_jax.train.optim import make_optimizer
from scalerl_jax.train.rl import rl_loss
from scalerl_jax.train.step import init_train_state, make_train_step
exp = small_plan(0).exp
mcfg = exp.model
opt = make_optimizer(exp.train)
step = jax.jit(make_train_step(rl_loss(mcfg, exp.loss), opt, 1))
state = init_train_state(init_params(mcfg, jax.random.PRNGKey(0)), opt)
rng = np.random.default_rng(0)
B, T = 64, 68  # a quarter of the small preset's batch: a 0.3 GB temporary, mmapped by malloc
mask = np.zeros((B, T), np.float32)
mask[:, 20:] = 1
losses = []
for i in range(2):
    batch = dict(tokens=rng.integers(2, mcfg.vocab_size, (B, T)).astype(np.int32), loss_mask=mask,
                 gen_logp=np.full((B, T), -2.0, np.float32), staleness=np.zeros((B, T), np.int32),
                 advantages=rng.normal(size=B).astype(np.float32), rewards=rng.random(B).astype(np.float32),
                 group_ids=np.repeat(np.arange(8), 8).astype(np.int32), truncated=np.zeros(B, np.float32))
    state, m = step(state, batch)
    losses.append(float(m["loss"]))
leaves = [np.asarray(x) for x in jax.tree.leaves(state.params)]
print("STEPS " + json.dumps({"losses": [l.hex() for l in losses], "params": [l.tobytes().hex()[:64] + str(
    float(np.abs(l).sum()).hex()) for l in leaves]}))
"""


@pytest.mark.skipif(not LIVE, reason="needs glibc 2.35+ and the kernel's transparent huge pages (madvise/always)")
def test_train_steps_are_bit_identical_with_and_without_huge_pages():
    """The tunable changes where malloc's memory comes from, never a number: two train steps of the small
    preset's model and row length give the same losses and parameters, bit for bit, with it and without it."""
    def steps(tunables: str | None) -> dict:
        env = {k: v for k, v in os.environ.items() if k not in ("GLIBC_TUNABLES", hostmem.OPT_OUT)}
        env.update(JAX_PLATFORMS="cpu", PYTHONPATH=str(ROOT))
        if tunables:
            env["GLIBC_TUNABLES"] = tunables
        r = subprocess.run([sys.executable, "-c", _STEPS], env=env, cwd=ROOT, capture_output=True, text=True,
                           timeout=HANG_S)
        assert r.returncode == 0, r.stderr
        return json.loads(next(x for x in r.stdout.splitlines() if x.startswith("STEPS ")).split(" ", 1)[1])

    plain, huge = steps(None), steps(hostmem.TUNABLE)
    assert len(set(plain["losses"])) == 2  # the first step moved the parameters
    assert plain == huge
