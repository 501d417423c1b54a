"""One run over many processes: ``jax.distributed`` start-up and the leader -> followers command channel.

Start-up (:func:`resolve`, :func:`initialize`), first source that applies:

1. ``--coordinator HOST:PORT --num-processes P --process-id I`` on the command line;
2. the environment: ``JAX_COORDINATOR_ADDRESS``, ``JAX_NUM_PROCESSES``, ``JAX_PROCESS_ID`` (what
   ``python -m scalerl_jax.launch`` sets);
3. SLURM: inside an ``srun`` step with more than one task (``SLURM_NTASKS`` > 1): the process count and rank
   from ``SLURM_NTASKS`` / ``SLURM_PROCID``, the coordinator on the step's first node (:func:`slurm_first_host`)
   at ``JAX_COORDINATOR_PORT`` or, as JAX picks it, ``61440 + SLURM_JOB_ID % 4096``;
4. none of them: a single process, nothing is initialised.

Devices: ``SCALERL_LOCAL_DEVICE_IDS`` (comma-separated ordinals among the GPUs this process sees; the launcher's
``--gpus-per-process`` sets it) restricts a process to those GPUs. Without it a process uses every GPU it sees,
except SLURM ranks that share a node's GPUs: :func:`slurm_local_devices` gives rank ``SLURM_LOCALID`` its own
slice. JAX's own SLURM detection is not used: it would give each rank GPU ``SLURM_LOCALID`` only, i.e. one GPU
per rank even for one rank per node.

On CPU the cross-process collectives use gloo (``jax_cpu_collectives_implementation``), so several processes on
one machine form one real multi-host mesh. Initialisation waits at most ``init_timeout_s`` (``--dist-timeout``)
for every process; afterwards the coordination service's heartbeats take every process down when one of them is
silent for ``heartbeat_timeout_s`` (``--heartbeat-timeout``, default :data:`HEARTBEAT_TIMEOUT_S`), instead of
leaving the others in a collective forever. Busy is not dead: a long compile or checkpoint save, or an overloaded
machine, stalls a healthy process, so the default is far above the longest stall measured; :class:`StallWatch`
logs every process's stalls against it. A process that dies is noticed sooner: a dead leader's closed sockets end
the followers at once, a dead follower fails the leader's next collective (and an uncaught error waits at most
10 s in JAX's shutdown barrier: :func:`_exit_without_barrier`), and the launcher stops the rest as soon as any
process exits.

Roles. Process 0 is the leader: it reads data, talks to the generators, scores, writes metrics, reports and the
fit. Every process holds its shards of the train state and runs the same jitted train step on one global mesh.
The leader drives the followers through a :class:`Channel`: a JSON header per command over the coordination
service's key-value store, then the command's arrays by ``broadcast_one_to_all`` (a collective, so large
batches do not go through the coordinator). A follower waits for the next command without a time limit (the
leader may generate or warm-start for hours): the coordination service, which runs inside process 0, is what
tells it the leader is gone (:meth:`Channel.recv`).
"""

from __future__ import annotations

import atexit
import dataclasses
import json
import os
import re
import sys
import threading
import time
from typing import Any

import numpy as np

from scalerl_jax.config import ConfigError

INIT_TIMEOUT_S = 300
# A process whose heartbeats stop for this long is declared dead and the run ends. Well above the longest stall of
# a healthy process measured on a loaded 2-core machine (BUILD.md, Multi-host trainer); a process that dies is
# not waited for this long: its closed sockets end the others (module docstring), and the launcher / srun
# --kill-on-bad-exit stops the rest when it exits.
HEARTBEAT_TIMEOUT_S = 300


@dataclasses.dataclass(frozen=True)
class DistConfig:
    coordinator: str  # HOST:PORT of process 0's coordination service
    num_processes: int
    process_id: int
    source: str  # "flags", "env" or "slurm"
    init_timeout_s: int = INIT_TIMEOUT_S
    heartbeat_timeout_s: int = HEARTBEAT_TIMEOUT_S
    local_device_ids: tuple[int, ...] | None = None  # GPU ordinals this process uses; None: every one it sees
    devices_from: str = ""  # where local_device_ids came from (for the start-up log)


def resolve(coordinator: str | None = None, num_processes: int | None = None, process_id: int | None = None,
            env: dict[str, str] | None = None, *, init_timeout_s: int = INIT_TIMEOUT_S,
            heartbeat_timeout_s: int = HEARTBEAT_TIMEOUT_S) -> DistConfig | None:
    """Which multi-process set-up applies (module docstring), with this process's GPUs; None for a single process.
    Errors name the flag or variable that is missing or wrong."""
    for name, value in (("--dist-timeout", init_timeout_s), ("--heartbeat-timeout", heartbeat_timeout_s)):
        if not (isinstance(value, int) and value >= 1):
            raise ConfigError(f"{name} must be a whole number of seconds >= 1, got {value!r}")
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
    elif _int_var(env, "SLURM_NTASKS", 1) > 1 and "SLURM_STEP_ID" in env:
        cfg = DistConfig(slurm_coordinator(env), _int_var(env, "SLURM_NTASKS"), _int_var(env, "SLURM_PROCID"),
                         "slurm", **kw)
    else:
        return None
    if cfg.num_processes < 1:
        raise ConfigError(f"number of processes must be >= 1, got {cfg.num_processes}")
    if not 0 <= cfg.process_id < cfg.num_processes:
        raise ConfigError(f"process id {cfg.process_id} is outside [0, {cfg.num_processes})")
    if ":" not in cfg.coordinator:
        raise ConfigError(f"coordinator address must be HOST:PORT, got {cfg.coordinator!r}")
    if cfg.num_processes == 1:
        return None
    ids, origin = local_devices(env, cfg.source)
    return dataclasses.replace(cfg, local_device_ids=ids, devices_from=origin)


def _int_var(env: dict[str, str], name: str, default: int | None = None) -> int:
    raw = env.get(name, "")
    if not raw.strip():
        if default is None:
            raise ConfigError(f"{name} is not set (needed for a multi-process start-up under SLURM)")
        return default
    try:
        return int(raw)
    except ValueError:
        raise ConfigError(f"{name} must be an integer, got {raw!r}") from None


# ---- SLURM --------------------------------------------------------------------------------------------------


def slurm_first_host(nodelist: str) -> str:
    """The first host of a SLURM node list: ``node[003-005,009],gpu2`` -> ``node003``, ``a[1-2]-ib`` -> ``a1-ib``."""
    host, i = [], 0
    while i < len(nodelist) and nodelist[i] != ",":
        if nodelist[i] == "[":
            end = nodelist.find("]", i)
            if end < 0:
                raise ConfigError(f"SLURM node list {nodelist!r}: '[' without ']'")
            host.append(re.split(r"[,-]", nodelist[i + 1:end])[0])
            i = end + 1
        else:
            host.append(nodelist[i])
            i += 1
    if not host:
        raise ConfigError(f"SLURM node list {nodelist!r} has no host")
    return "".join(host)


def slurm_coordinator(env: dict[str, str]) -> str:
    """HOST:PORT of process 0 in a SLURM step: the step's first node (rank 0 runs there) and
    ``JAX_COORDINATOR_PORT`` or the port JAX itself would pick, ``61440 + SLURM_JOB_ID % 4096``."""
    nodes = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST")
    if not nodes:
        raise ConfigError("SLURM_STEP_NODELIST (or SLURM_JOB_NODELIST) is not set: cannot find process 0's host")
    port = _int_var(env, "JAX_COORDINATOR_PORT", 0) or 61440 + _int_var(env, "SLURM_JOB_ID") % 4096
    return f"{slurm_first_host(nodes)}:{port}"


def slurm_tasks_on_node(env: dict[str, str]) -> int:
    """Tasks of this step on this node: ``SLURM_STEP_TASKS_PER_NODE`` (``2(x3),1``: 2 on each of the first
    three nodes, 1 on the fourth) at ``SLURM_NODEID``, else ``SLURM_NTASKS_PER_NODE``, else 1."""
    for name in ("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"):
        if env.get(name):
            counts = []
            for part in env[name].split(","):
                m = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", part)
                if not m:
                    raise ConfigError(f"{name}={env[name]!r}: expected counts like 2(x3),1")
                counts += [int(m.group(1))] * int(m.group(2) or 1)
            node = _int_var(env, "SLURM_NODEID", 0)
            if node >= len(counts):
                raise ConfigError(f"SLURM_NODEID {node} is past {name}={env[name]!r}")
            return counts[node]
    return _int_var(env, "SLURM_NTASKS_PER_NODE", 1)


def _count(raw: str | None) -> int | None:
    """A GPU count as SLURM writes it: ``2`` or ``h100:2``."""
    if not raw or not raw.strip():
        return None
    try:
        return int(raw.strip().rsplit(":", 1)[-1])
    except ValueError:
        return None


def slurm_local_devices(env: dict[str, str]) -> tuple[tuple[int, ...] | None, str]:
    """This SLURM rank's GPUs among those it sees (``CUDA_VISIBLE_DEVICES``). One rank on the node: all of them.
    Several ranks on the node, ``G`` GPUs each (``SLURM_GPUS_PER_TASK``, else ``SLURM_GPUS_ON_NODE`` / ranks, else
    visible / ranks): a rank that sees ``G`` GPUs already has only its own (SLURM bound them per task, as
    ``--gpus-per-task`` does); a rank that sees all ``G x ranks`` takes ordinals ``L*G .. L*G+G-1``,
    ``L = SLURM_LOCALID``. Anything else is refused (``SCALERL_LOCAL_DEVICE_IDS`` then says it explicitly)."""
    tasks = slurm_tasks_on_node(env)
    if tasks <= 1:
        return None, "every GPU this task sees (one rank on this node)"
    local = _int_var(env, "SLURM_LOCALID")
    raw = env.get("CUDA_VISIBLE_DEVICES")
    visible = None if raw is None else [v for v in raw.split(",") if v.strip()]
    per_task = _count(env.get("SLURM_GPUS_PER_TASK"))
    on_node = _count(env.get("SLURM_GPUS_ON_NODE"))
    g = per_task or (on_node // tasks if on_node else None) or (len(visible) // tasks if visible else None)
    where = f"SLURM_LOCALID {local} of {tasks} ranks on this node"
    if visible is None:  # JAX's own rule for SLURM (one GPU per rank), generalised to G
        g = g or 1
        return tuple(range(local * g, local * g + g)), f"{where}, {g} each (CUDA_VISIBLE_DEVICES unset)"
    if g and len(visible) == g:
        return None, f"the {g} GPU(s) SLURM bound to this task"
    if g and len(visible) == g * tasks:
        return tuple(range(local * g, local * g + g)), f"{where}, {g} each of the {len(visible)} visible"
    raise ConfigError(f"SLURM: {tasks} ranks share this node and rank {local} sees {len(visible)} GPU(s) "
                      f"(CUDA_VISIBLE_DEVICES={raw!r}, SLURM_GPUS_PER_TASK={env.get('SLURM_GPUS_PER_TASK')!r}, "
                      f"SLURM_GPUS_ON_NODE={env.get('SLURM_GPUS_ON_NODE')!r}): cannot tell which are its own. Use "
                      "--gpus-per-task, or set SCALERL_LOCAL_DEVICE_IDS (ordinals among the visible GPUs)")


def local_devices(env: dict[str, str], source: str) -> tuple[tuple[int, ...] | None, str]:
    """The GPU ordinals (among those ``CUDA_VISIBLE_DEVICES`` leaves visible) this process uses, and why; None:
    every visible one. ``SCALERL_LOCAL_DEVICE_IDS`` first, then the SLURM split (:func:`slurm_local_devices`)."""
    raw = env.get("SCALERL_LOCAL_DEVICE_IDS", "")
    if raw.strip():
        try:
            ids = tuple(int(x) for x in raw.split(","))
        except ValueError:
            raise ConfigError(f"SCALERL_LOCAL_DEVICE_IDS must be comma-separated GPU ordinals, got {raw!r}") from None
        if min(ids) < 0 or len(set(ids)) != len(ids):
            raise ConfigError(f"SCALERL_LOCAL_DEVICE_IDS must be distinct ordinals >= 0, got {raw!r}")
        return ids, "SCALERL_LOCAL_DEVICE_IDS"
    if source == "slurm":
        return slurm_local_devices(env)
    return None, "every visible device"


def channel_poll_s(env: dict[str, str] | None = None) -> float:
    """Seconds of one key-value wait of a follower (``SCALERL_CHANNEL_POLL_S``, default 30): only how often it
    wakes up; the wait itself has no limit (:meth:`Channel.recv`)."""
    raw = (os.environ if env is None else env).get("SCALERL_CHANNEL_POLL_S", "").strip()
    try:
        poll = float(raw) if raw else 30.0
    except ValueError:
        raise ConfigError(f"SCALERL_CHANNEL_POLL_S must be a number of seconds, got {raw!r}") from None
    if not poll > 0:
        raise ConfigError(f"SCALERL_CHANNEL_POLL_S must be > 0, got {raw!r}")
    return poll


def initialize(cfg: DistConfig | None, log=print) -> StallWatch | None:
    """``jax.distributed.initialize`` for ``cfg`` (nothing for None). Must run before any other JAX call. Returns
    the process's running :class:`StallWatch`."""
    if cfg is None:
        return None
    import jax

    jax.config.update("jax_cpu_collectives_implementation", "gloo")  # CPU devices only; accelerators use theirs
    # everything is resolved here (SLURM included), so JAX's cluster detection is off: under SLURM it would
    # otherwise restrict every process to the single GPU SLURM_LOCALID whenever local_device_ids is None
    kw: dict[str, Any] = dict(coordinator_address=cfg.coordinator, num_processes=cfg.num_processes,
                              process_id=cfg.process_id, initialization_timeout=cfg.init_timeout_s,
                              heartbeat_timeout_seconds=cfg.heartbeat_timeout_s, cluster_detection_method="deactivate",
                              local_device_ids=list(cfg.local_device_ids) if cfg.local_device_ids else None)
    poll = channel_poll_s()
    t0 = time.time()
    try:
        jax.distributed.initialize(**kw)
    except Exception as e:  # noqa: BLE001 -- re-raised with what to check
        raise RuntimeError(f"jax.distributed.initialize ({cfg.source}: coordinator {cfg.coordinator}, "
                           f"{cfg.num_processes} processes, this is {cfg.process_id}) failed after "
                           f"{time.time() - t0:.0f}s: {e}. Every process must be started with the same coordinator "
                           "and process count, and process 0 must be reachable on that port.") from e
    ids = ",".join(map(str, cfg.local_device_ids)) if cfg.local_device_ids else "all"
    log(f"[dist] process {jax.process_index()} of {jax.process_count()}: {jax.local_device_count()} local and "
        f"{jax.device_count()} global devices ({cfg.source}; coordinator {cfg.coordinator}); GPUs {ids} "
        f"({cfg.devices_from})")
    log(f"[dist] timeouts: start-up {cfg.init_timeout_s}s (--dist-timeout); heartbeat {cfg.heartbeat_timeout_s}s "
        f"(--heartbeat-timeout: a process silent that long ends the run; a leader that exits ends the followers at "
        f"once); followers wait for the leader's commands without a time limit, waking every {poll:g}s")
    sys.excepthook = _exit_without_barrier(sys.excepthook, jax.process_index())
    return StallWatch(jax.process_index(), cfg.heartbeat_timeout_s, log=log).start()


def _exit_without_barrier(previous, process: int, grace_s: float = 10.0):
    """An uncaught exception ends a multi-process process within ``grace_s``. Python's exit runs JAX's atexit
    ``jax.distributed.shutdown``, whose barrier waits for every process: when the error is another process's death
    (gloo: "Connection closed by peer"), that wait lasted until the dead one's heartbeats timed out. The traceback
    and the exit handlers (stopping generator fleets, the barrier) still run; a timer ends the process with
    status 1 if they have not finished after ``grace_s`` (processes that are alive meet the barrier sooner: a
    leader's error then reaches its followers as its "stop" message). This process's closed sockets then end the
    others (the followers at once when this is the leader; the leader at its next collective)."""

    def hook(kind, value, tb):
        previous(kind, value, tb)

        def leave() -> None:
            time.sleep(grace_s)
            print(f"[dist] process {process} failed ({kind.__name__}): exiting without jax.distributed's shutdown "
                  f"barrier after {grace_s:g}s", file=sys.stderr, flush=True)
            sys.stdout.flush()
            os._exit(1)

        threading.Thread(target=leave, name="scalerl-exit-timer", daemon=True).start()

    return hook


class StallWatch:
    """How long this process went without running: a daemon thread that wakes every ``period_s`` and measures how
    late it woke. The coordination client's heartbeats come from a thread of this process too, so the longest
    stall bounds the heartbeat gap a slow machine, a long compile or a checkpoint save caused; a Python thread also
    waits for the GIL, so it over- rather than under-states the gap. A stall of more than ``report_s`` (default: a
    quarter of the heartbeat timeout; ``SCALERL_STALL_REPORT_S``) is logged when it ends, and the longest one at
    exit, each beside the heartbeat timeout it has to stay below."""

    def __init__(self, process: int, heartbeat_timeout_s: float, *, period_s: float = 0.5,
                 report_s: float | None = None, log=print) -> None:
        self.process, self.heartbeat_timeout_s, self.period_s, self.log = process, heartbeat_timeout_s, period_s, log
        if report_s is None:
            raw = os.environ.get("SCALERL_STALL_REPORT_S", "").strip()
            try:
                report_s = float(raw) if raw else heartbeat_timeout_s / 4
            except ValueError:
                raise ConfigError(f"SCALERL_STALL_REPORT_S must be a number of seconds, got {raw!r}") from None
        self.report_s = report_s
        self.longest_s = 0.0
        self._stop = threading.Event()

    def start(self) -> StallWatch:
        threading.Thread(target=self._run, name="scalerl-stall-watch", daemon=True).start()
        atexit.register(self.close)
        return self

    def _run(self) -> None:
        last = time.monotonic()
        while not self._stop.wait(self.period_s):
            now = time.monotonic()
            self.note(now - last - self.period_s)
            last = now

    def note(self, stall_s: float) -> None:
        self.longest_s = max(self.longest_s, stall_s)
        if stall_s > self.report_s:
            self.log(f"[dist] process {self.process} did not run for {stall_s:.1f}s (heartbeat timeout "
                     f"{self.heartbeat_timeout_s}s; raise --heartbeat-timeout if stalls come near it)")

    def close(self) -> None:
        if not self._stop.is_set():
            self._stop.set()
            self.log(f"[dist] process {self.process}: longest stall {self.longest_s:.1f}s (heartbeat timeout "
                     f"{self.heartbeat_timeout_s}s)")


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

    def __init__(self, poll_s: float | None = None) -> None:
        from jax._src import distributed

        self._client = distributed.global_state.client
        if self._client is None:
            raise RuntimeError("Channel needs jax.distributed to be initialised")
        self.poll_s = channel_poll_s() if poll_s is None else float(poll_s)
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
        """The next command, waited for without a time limit (the leader may warm-start or generate for hours).

        A leader that dies does not show up here as a timeout. Measured with jaxlib 0.10: when process 0 is
        killed, its sockets close, this process's coordination client sees ``UNAVAILABLE`` within milliseconds and
        JAX terminates the process (SIGABRT, "Terminating process because the JAX distributed service detected
        fatal errors ... Either the leader task was preempted/died/restarted unexpectedly"). A leader that hangs
        (stopped, or its host unreachable) still answers nothing, so each wait below ends with a plain timeout,
        until the client's heartbeats have failed for ``heartbeat_timeout_s``: then JAX ends the process the same
        way. A timeout of one ``poll_s`` wait is therefore "still waiting"; any other error from the get (it can
        fail before JAX's termination lands) is the leader gone and raises at once."""
        key = f"{self.PREFIX}{self._n}"
        t0 = time.monotonic()
        while True:
            try:
                raw = self._client.blocking_key_value_get(key, max(1, int(self.poll_s * 1000)))
                break
            except Exception as e:  # noqa: BLE001 -- a timeout of this wait; anything else is fatal
                if "DEADLINE_EXCEEDED" in str(e) or "timed out" in str(e).lower():
                    continue
                msg = (f"lost the leader (process 0) after waiting {time.monotonic() - t0:.0f}s for command "
                       f"{self._n}: it died, or the coordination service it runs is unreachable ({e})")
                print(f"[dist] {msg}", file=sys.stderr, flush=True)
                raise RuntimeError(msg) from e
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


# ---- agreement between processes (checkpoint restore) --------------------------------------------------------


def _kv_client():
    from jax._src import distributed

    client = distributed.global_state.client
    if client is None:
        raise RuntimeError("jax.distributed is not initialised")
    return client


def leader_json(tag: str, value: Any, timeout_s: float = 3600.0) -> Any:
    """The leader's ``value`` (JSON-serialisable) on every process; ``tag`` must be used once per run."""
    import jax

    key = f"scalerl/leader/{tag}"
    if jax.process_index() == 0:
        _kv_client().key_value_set(key, json.dumps(value))
        return value
    return json.loads(_kv_client().blocking_key_value_get(key, int(timeout_s * 1000)))


def agree(tag: str, error: str | None, timeout_s: float = 600.0) -> list[tuple[int, str]]:
    """Every process's failure at one point, on every process: [(process, reason)], empty when all succeeded.
    Every process must call it with the same ``tag`` (once per run). Through the coordination service's key-value
    store, not a device collective, so it never pairs up with a collective another process is in (orbax's
    barriers)."""
    import jax

    client = _kv_client()
    client.key_value_set(f"scalerl/agree/{tag}/{jax.process_index()}", json.dumps(error))
    out = []
    for p in range(jax.process_count()):
        reason = json.loads(client.blocking_key_value_get(f"scalerl/agree/{tag}/{p}", int(timeout_s * 1000)))
        if reason is not None:
            out.append((p, reason))
    return out
