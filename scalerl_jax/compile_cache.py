"""JAX's persistent compilation cache for every process a run starts: a program compiled once (the warm start's
step, the train step, the engine's prefill and decode, the refit's sampler) is loaded from disk by the next run
with the same shapes instead of compiled again.

The cache directory is ``JAX_COMPILATION_CACHE_DIR`` when set, else ``$XDG_CACHE_HOME/scalerl_jax/xla`` (default
``~/.cache/scalerl_jax/xla``). ``JAX_ENABLE_COMPILATION_CACHE=false`` turns it off. JAX keeps only compiles that
took at least ``JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS`` (default 1 s); its entries are keyed by the program,
the JAX and XLA versions, the devices and the flags, so a stale entry is never used.
"""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """Where the compiled programs are kept (see the module docstring)."""
    if os.environ.get("JAX_COMPILATION_CACHE_DIR"):
        return Path(os.environ["JAX_COMPILATION_CACHE_DIR"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "scalerl_jax" / "xla"


def enabled() -> bool:
    return os.environ.get("JAX_ENABLE_COMPILATION_CACHE", "true").strip().lower() not in ("0", "false", "no")


def use_compile_cache(log=None) -> Path | None:
    """Point this process's JAX at the cache (before its first compile); returns the directory, None when off."""
    if not enabled():
        return None
    import jax

    d = cache_dir()
    try:
        d.mkdir(parents=True, exist_ok=True)
    except OSError as e:  # a read-only home: the run goes on compiling everything, and says why once
        if log is not None:
            log(f"[run] no compilation cache: {d} cannot be created ({e}); set JAX_COMPILATION_CACHE_DIR")
        return None
    jax.config.update("jax_compilation_cache_dir", str(d))
    return d
