"""One run over many processes: ``jax.distributed`` start-up and the leader -> followers command channel.

Start-up (:func:`initialize`), first source that applies:

1. ``--coordinator HOST:PORT --num-processes P --process-id I`` on the command line;
2. the environment: ``JAX_COORDINATOR_ADDRESS``, ``JAX_NUM_PROCESSES``, ``JAX_PROCESS_ID`` (what
   ``python -m scalerl_jax.launch`` sets);
3. SLURM: inside an ``srun`` step with more than one task (``SLURM_NTASKS`` > 1), JAX's own cluster detection
   reads the coordinator, process count and rank from SLURM's variables;
4. none of them: a single process, nothing is initialised.

On CPU the cross-process collectives use gloo (``jax_cpu_collectives_implementation``), so several processes on
one machine form one real multi-host mesh. Initialisation waits at most ``init_timeout_s`` for every process;
afterwards the coordination service's heartbeats (``heartbeat_timeout_s``) take every process down when one of
them dies, instead of leaving the others in a collective forever.

Roles. Process 0 is the leader: it reads data, talks to the generators, scores, writes metrics, reports and the
fit. Every process holds its shards of the train state and runs the same jitted train step on one global mesh.
The leader drives the followers through a :class:`Channel`: a JSON header per command over the coordination
service's key-value store (a follower may wait there for minutes while the leader generates), then the command's
arrays by ``broadcast_one_to_all`` (a collective, so large batches do not go through the coordinator).
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from typing import Any

import numpy as np

from scalerl_jax.config import ConfigError


@dataclasses.dataclass(frozen=True)
class DistConfig:
    coordinator: str | None  # HOST:PORT of process 0's coordination service; None: SLURM auto-detection
    num_processes: int | None
    process_id: int | None
    source: str  # "flags", "env" or "slurm"
    init_timeout_s: int = 300
    heartbeat_timeout_s: int = 60


def resolve(coordinator: str | None = None, num_processes: int | None = None, process_id: int | None = None,
            env: dict[str, str] | None = None, *, init_timeout_s: int = 300,
            heartbeat_timeout_s: int = 60) -> DistConfig | None:
    """Which multi-process set-up applies (module docstring); None for a single process. Errors name the flag or
    variable that is missing or wrong."""
    env = dict(os.environ if env is None else env)
    given = [coordinator is not None, num_processes is not None, process_id is not None]
    kw = dict(init_timeout_s=init_timeout_s, heartbeat_timeout_s=heartbeat_timeout_s)
    if any(given):
        if not all(given):
            raise ConfigError("multi-process start-up needs all of --coordinator HOST:PORT, --num-processes P and "
                              "--process-id I")
        cfg = DistConfig(coordinator, num_processes, process_id, "flags", **kw)
    elif "JAX_COORDINATOR_ADDRESS" in env:
        try:
            n, i = int(env["JAX_NUM_PROCESSES"]), int(env["JAX_PROCESS_ID"])
        except KeyError as e:
            raise ConfigError(f"JAX_COORDINATOR_ADDRESS is set but {e.args[0]} is not") from None
        except ValueError as e:
            raise ConfigError(f"JAX_NUM_PROCESSES / JAX_PROCESS_ID must be integers: {e}") from None
        cfg = DistConfig(env["JAX_COORDINATOR_ADDRESS"], n, i, "env", **kw)
    elif int(env.get("SLURM_NTASKS", "1") or 1) > 1 and "SLURM_STEP_ID" in env:
        return DistConfig(None, None, None, "slurm", **kw)
    else:
        return None
    if cfg.num_processes < 1:
        raise ConfigError(f"number of processes must be >= 1, got {cfg.num_processes}")
    if not 0 <= cfg.process_id < cfg.num_processes:
        raise ConfigError(f"process id {cfg.process_id} is outside [0, {cfg.num_processes})")
    if ":" not in cfg.coordinator:
        raise ConfigError(f"coordinator address must be HOST:PORT, got {cfg.coordinator!r}")
    return None if cfg.num_processes == 1 else cfg


def initialize(cfg: DistConfig | None, log=print) -> None:
    """``jax.distributed.initialize`` for ``cfg`` (nothing for None). Must run before any other JAX call."""
    if cfg is None:
        return
    import jax

    jax.config.update("jax_cpu_collectives_implementation", "gloo")  # CPU devices only; accelerators use theirs
    kw: dict[str, Any] = dict(initialization_timeout=cfg.init_timeout_s,
                              heartbeat_timeout_seconds=cfg.heartbeat_timeout_s)
    if cfg.source != "slurm":
        kw.update(coordinator_address=cfg.coordinator, num_processes=cfg.num_processes, process_id=cfg.process_id)
    t0 = time.time()
    try:
        jax.distributed.initialize(**kw)
    except Exception as e:  # noqa: BLE001 -- re-raised with what to check
        raise RuntimeError(f"jax.distributed.initialize ({cfg.source}: coordinator {cfg.coordinator}, "
                           f"{cfg.num_processes} processes, this is {cfg.process_id}) failed after "
                           f"{time.time() - t0:.0f}s: {e}. Every process must be started with the same coordinator "
                           "and process count, and process 0 must be reachable on that port.") from e
    log(f"[dist] process {jax.process_index()} of {jax.process_count()}: {jax.local_device_count()} local and "
        f"{jax.device_count()} global devices ({cfg.source}; coordinator {cfg.coordinator or 'from SLURM'})")


def process_count() -> int:
    import jax

    return jax.process_count()


def is_leader() -> bool:
    import jax

    return jax.process_index() == 0


# ---- leader -> followers -----------------------------------------------------------------------------------


class Channel:
    """Ordered commands from the leader to every follower (module docstring). ``send`` on the leader and ``recv``
    on each follower must be called in the same order: command ``n`` goes to key ``scalerl/cmd/n``."""

    PREFIX = "scalerl/cmd/"

    def __init__(self, wait_timeout_s: float = 3600.0) -> None:
        from jax._src import distributed

        self._client = distributed.global_state.client
        if self._client is None:
            raise RuntimeError("Channel needs jax.distributed to be initialised")
        self.wait_timeout_s = wait_timeout_s
        self._n = 0
        self.closed = False  # the leader sent "stop"

    def send(self, cmd: str, meta: dict[str, Any] | None = None,
             arrays: dict[str, np.ndarray] | None = None) -> None:
        if self.closed:
            raise RuntimeError(f"command {cmd!r} after the followers were stopped")
        self.closed = cmd == "stop"
        arrays = {k: np.ascontiguousarray(v) for k, v in (arrays or {}).items()}
        header = {"cmd": cmd, "meta": meta or {},
                  "arrays": {k: [list(v.shape), v.dtype.str] for k, v in arrays.items()}}
        self._client.key_value_set(f"{self.PREFIX}{self._n}", json.dumps(header))
        self._n += 1
        if arrays:
            _broadcast(arrays, source=True)

    def recv(self) -> tuple[str, dict[str, Any], dict[str, np.ndarray]]:
        key = f"{self.PREFIX}{self._n}"
        deadline = time.time() + self.wait_timeout_s
        while True:  # in slices, so that a leader that is merely slow (a long generation) is waited for
            try:
                raw = self._client.blocking_key_value_get(key, 30_000)
                break
            except Exception as e:  # noqa: BLE001 -- a timeout of this slice; anything else is fatal
                if "DEADLINE_EXCEEDED" not in str(e) and "timed out" not in str(e).lower():
                    raise RuntimeError(f"lost the leader while waiting for command {self._n}: {e}") from e
                if time.time() > deadline:
                    raise TimeoutError(f"no command from the leader (process 0) for {self.wait_timeout_s:.0f}s "
                                       f"(waiting for command {self._n})") from None
        self._n += 1
        header = json.loads(raw)
        arrays: dict[str, np.ndarray] = {}
        if header["arrays"]:
            like = {k: np.zeros(shape, np.dtype(dt)) for k, (shape, dt) in header["arrays"].items()}
            arrays = _broadcast(like, source=False)
        return header["cmd"], header["meta"], arrays


def _broadcast(arrays: dict[str, np.ndarray], *, source: bool) -> dict[str, np.ndarray]:
    from jax.experimental import multihost_utils

    out = multihost_utils.broadcast_one_to_all(arrays, is_source=source)
    return {k: np.asarray(v) for k, v in out.items()}


def put_global(tree: Any, shardings: Any) -> Any:
    """Host arrays (the same values on every process: a broadcast batch, the initial state) onto global
    shardings: each process creates only the shards its own devices hold (``make_array_from_callback`` asks
    for exactly those slices, e.g. the batch rows of this process)."""
    import jax

    return jax.tree.map(lambda x, s: jax.make_array_from_callback(np.shape(x), s, lambda idx: np.asarray(x)[idx]),
                        tree, shardings)


def gather_to_host(tree: Any) -> Any:
    """Every leaf of a (sharded, global) pytree as one host NumPy array on every process (a collective)."""
    from jax.experimental import multihost_utils

    return multihost_utils.process_allgather(tree, tiled=True)
