"""scalerl_jax/compile_cache.py: where a run's compiled programs are kept, and that a process pointed at the cache
writes its compiles there (and, turned off, writes nothing)."""

import os
import subprocess
import sys

from scalerl_jax.compile_cache import cache_dir, enabled
from tests.conftest import HANG_S, ROOT

_CHILD = """
import jax, jax.numpy as jnp
from scalerl_jax.compile_cache import use_compile_cache
print(use_compile_cache())
jax.jit(lambda x: jnp.sin(x) @ x.T + 1.0)(jnp.ones((64, 64))).block_until_ready()
"""


def _child(env_extra: dict, tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("JAX_COMPILATION_CACHE_DIR",
                                                            "JAX_ENABLE_COMPILATION_CACHE")}
    env.update({"JAX_PLATFORMS": "cpu", "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
                "XDG_CACHE_HOME": str(tmp_path), **env_extra})
    r = subprocess.run([sys.executable, "-c", _CHILD], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=HANG_S)
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout.strip().splitlines()[-1]


def test_the_cache_directory_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert cache_dir() == tmp_path / "scalerl_jax" / "xla"
    monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", str(tmp_path / "mine"))
    assert cache_dir() == tmp_path / "mine"
    for off in ("false", "0", "No"):
        monkeypatch.setenv("JAX_ENABLE_COMPILATION_CACHE", off)
        assert not enabled()
    monkeypatch.setenv("JAX_ENABLE_COMPILATION_CACHE", "true")
    assert enabled()


def test_a_process_writes_its_compiles_to_the_cache_unless_turned_off(tmp_path):
    default = tmp_path / "scalerl_jax" / "xla"
    assert _child({}, tmp_path) == str(default)
    assert any(default.iterdir())  # the jitted program (and JAX's own small ones) are on disk
    off = tmp_path / "off"
    assert _child({"JAX_ENABLE_COMPILATION_CACHE": "false", "XDG_CACHE_HOME": str(off)}, tmp_path) == "None"
    assert not (off / "scalerl_jax").exists()
