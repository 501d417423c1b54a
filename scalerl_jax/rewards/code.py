"""Code reward: +1 when a completion's program passes its task's tests in a sandbox, else -1.

    python -m scalerl_jax.rewards.code --program FILE --tests FILE [--entry-point NAME] [--timeout S]

runs FILE then its tests and prints one JSON object ``{"passed": bool, "reason": str, "seconds": float,
"isolation": str, "detail": str}``; it exits 0 whether the program passed or not (2 for a usage error). Tests are
plain asserts, or, with ``--entry-point NAME``, HumanEval-style: they define ``check(candidate)``, which is called
with the program's function ``NAME``. ``--prompt FILE``: the task's code prefix, whose helpers the tests use.

The sandbox (:mod:`scalerl_jax.rewards.sandbox`) is the security boundary of the system. A run has two sandboxed
interpreters: the program's, which runs the program and answers calls with plain values, and the tests', which
runs the tests against proxies of the program's names, compares type-strictly and alone writes the verdict. With
bubblewrap each sees no network, no host file system beyond a read-only interpreter and system libraries, no host
processes, no host IPC objects, fresh size-capped tmpfs for its scratch directory, ``/tmp`` and ``/dev/shm``, no
``memfd_create`` (seccomp), and runs under rlimits (CPU seconds, address space, processes, file size, open files),
a wall clock that kills its whole process tree, and capped output. The ``rlimits`` mode confines each with pid,
network, IPC and mount namespaces where the kernel allows them (root, or unprivileged user namespaces; the mount
namespace gives it a size-capped tmpfs scratch directory), Landlock, a seccomp filter (no sockets, no memfd, no
System V IPC) and rlimits; it refuses to start with network access or without Landlock (``rlimits-weak`` names
the mode without Landlock explicitly); ``auto`` falls back to ``rlimits`` with a loud warning. Every
:class:`CodeResult` names the isolation it ran under.

Reasons (:data:`REASONS`): ``passed``; ``failed`` (an assert or exception in the program or its tests, with the
message and line in ``detail``; a value that is not plain; a comparison no value may satisfy); ``timeout`` (the
wall clock, or a CPU time at the CPU limit as observed outside the program); ``memory`` (a MemoryError under the
address-space limit, or the run's processes together over ``memory_mb``); ``output_limit`` (more than
``max_output_bytes`` on stdout or stderr); ``crash`` (the program's process ended during the tests: ``os._exit``,
a signal, any exit status, whatever number it is); ``sandbox_error`` (the machinery failed: it did not start, or a
worker never came back; never how a program ended).

What the program can and cannot do:

- It can return any plain value, raise, print, exit: none of it is a verdict. It cannot make a failing test pass
  except by returning the right value: objects with their own ``__eq__`` / ``__bool__``, subclasses of ``int`` or
  ``bool`` and anything else that is not plain fail the test ("not a plain value"). The standard library's
  containers that compare equal to plain values (``Counter``, ``OrderedDict``, ``defaultdict``, namedtuples,
  ``UserDict`` / ``UserList`` / ``UserString``) cross as those values, their contents read with the base type's
  methods. Every comparison the tests make (every operator, ``in``, chains, ``math.isclose`` / ``cmath.isclose``,
  ``unittest`` assertions, nested containers, set members, dict keys) is type-strict: a ``bool`` is not an
  ``int``; ints and floats compare by value; NaN equals nothing, and a NaN (or a bool against a number) in an
  ordering comparison fails the program whichever way round the check is written, even if the tests catch it.
  So are the comparisons made inside a lookup or a call: ``d[k]`` / ``d.get(k)`` (a ``Counter``'s too) find only
  a key of ``k``'s kind, ``list.count`` / ``index`` / ``remove`` / ``sort``, ``max`` / ``min`` / ``sorted``
  (no NaN, no bool among numbers), ``sum`` (no bool among numbers), set operators and methods (no bool merged with
  a number); a bool in arithmetic with a number, negated, rounded or passed to ``abs`` / ``math.fabs`` fails the
  program. Augmented assignments (``n += a == b``) and explicit conversions (``int()``, ``float()``, ``str()``,
  ``%`` formatting) stay as Python has them, and so do functions of other modules (``heapq``, ``bisect``,
  ``statistics``).
- An exception it raises reaches the tests as the same builtin type, or as a class of its name under its builtin
  base (a ``ValueError`` subclass is caught by ``except ValueError``); ``StopIteration`` and
  ``StopAsyncIteration`` (and their subclasses) arrive as a ``RuntimeError``, so a call the tests make from
  ``map`` / ``filter`` / ``zip`` / ``next`` cannot end the tests' loop early.
- Text it returns that the tests ``eval`` / ``exec`` / ``compile`` is evaluated only if it is literals and
  arithmetic (no names, attributes, calls or comprehensions; ``exec`` never), with empty builtins; code strings
  written in the tests themselves run as written. Both compare and compute type-strictly, as the tests do.
- Helpers the task's prompt defines (HumanEval's ``poly``, ``encode_cyclic``, ``encode_shift``) are defined in the
  tests' interpreter from the prompt's text (the ``prompt`` of :meth:`Sandbox.run`, a task's ``code_prefix``): the
  tests never call the program's versions. The prompt's last function (the one the completion writes), the entry
  point and stubs stay the program's. Of a prompt that is not a complete module (a prefix continued
  mid-statement), the complete top-level statements before the unfinished one are the task's.
- It sees the arguments of every call. Values cross by copy: a test that checks how the program mutated an argument
  sees the argument unchanged, and objects (instances, generators, functions) cannot be passed either way: tests in
  the ``Solution().method()`` style need an adapter that calls a function. Program names the tests use inside a
  code string of their own (for ``eval`` / ``exec``) are bound as those in their code.
- The ``rlimits`` mode reads the host's file system where Landlock allows it (the interpreter, the system
  libraries, ``/proc``). Without namespaces (no root and no unprivileged user namespaces): Landlock blocks TCP but
  not UDP, the process tree is killed by a sweep from the launcher (its child subreaper) rather than by the end of a
  pid namespace, and the scratch directory is on the host's disk, capped per file only (``RLIMIT_FSIZE``).
- The seccomp filters cover the calls named above; the rest of the kernel's system-call surface is reachable inside
  the namespaces.
- Where the trainer can make cgroups (root, writable cgroup v1 hierarchies; :mod:`scalerl_jax.rewards.cgroups`)
  each interpreter's tree has its own: every page it holds (tmpfs files, shared memory, page cache) counts against
  ``memory_mb`` and the kernel's OOM count makes the reason ``memory``; the tree gets ``cpu_cores`` cores at most
  (its children slow only their own run) and its CPU seconds together are held to the CPU limit. Elsewhere
  (cgroup v2, or not root) ``RLIMIT_AS`` binds each process exactly and the run's total is sampled every 0.25 s,
  so a burst can exceed ``memory_mb`` briefly (never ``max_procs * memory_mb``); CPU is limited per process
  (``RLIMIT_CPU``), so a program's children in their own sessions can slow other runs on the same machine until
  the wall clock ends them; memory in tmpfs files is bounded by the tmpfs sizes (``max_file_mb`` each).

Batches go through a bounded pool of workers (:class:`~scalerl_jax.rewards.code_pool.CodePool`), so code rewards
run beside generation and one slow program holds one worker for at most its own timeout.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from scalerl_jax.rewards.code_pool import CodeJob, CodePool
from scalerl_jax.rewards.code_types import (  # noqa: F401  (re-exported: the reward's public names)
    HEAD_BYTES,
    ISOLATIONS,
    NO_PROGRAM,
    REASONS,
    CodeResult,
    Isolation,
    SandboxConfig,
    classify_run,
)
from scalerl_jax.rewards.sandbox import Sandbox, SandboxError

if TYPE_CHECKING:
    from scalerl_jax.data.code_tasks import CodeTask

def run_program(program: str, tests: str, entry_point: str | None = None,
                config: SandboxConfig | None = None, prompt: str = "") -> CodeResult:
    """Run one program and its tests in a fresh :class:`~scalerl_jax.rewards.sandbox.Sandbox` (the isolation probe
    is cached per process). For many programs use a :class:`~scalerl_jax.rewards.code_pool.CodePool`."""
    return Sandbox(config).run(program, tests, entry_point, prompt)


_default: CodePool | None = None
_default_lock = threading.Lock()


def default_pool() -> CodePool:
    """A process-wide :class:`~scalerl_jax.rewards.code_pool.CodePool` with the default config, made on first use."""
    global _default
    with _default_lock:
        if _default is None:
            _default = CodePool(SandboxConfig())
        return _default


def code_results(completions: Sequence[str], tasks: Sequence[CodeTask], pool: CodePool | None = None
                 ) -> list[CodeResult]:
    """One :class:`CodeResult` per completion: the program extracted from it
    (:func:`~scalerl_jax.data.code_tasks.extract_program`) run against its task's tests through ``pool`` (default:
    :func:`default_pool`). A completion without a program fails without a run (``detail`` says so). Identical jobs
    (same program, tests and entry point: the samples of one prompt often agree) run once and share the result."""
    from scalerl_jax.data.code_tasks import extract_program

    if len(completions) != len(tasks):
        raise ValueError(f"code_results: {len(completions)} completions for {len(tasks)} tasks")
    pool = pool or default_pool()
    programs = [extract_program(c, t.code_prefix, t.entry_point) for c, t in zip(completions, tasks, strict=True)]
    jobs = {k: CodeJob(programs[k], tasks[k].tests, tasks[k].entry_point, tasks[k].code_prefix)
            for k, p in enumerate(programs) if p is not None}
    unique = list(dict.fromkeys(jobs.values()))
    ran = dict(zip(unique, pool.map(unique), strict=True))
    return [ran[jobs[k]] if k in jobs else CodeResult(False, "failed", 0.0, NO_PROGRAM, pool.isolation)
            for k in range(len(programs))]


def score_code(completions: Sequence[str], tasks: Sequence[CodeTask], pool: CodePool | None = None
               ) -> tuple[np.ndarray, dict[str, int]]:
    """+1/-1 rewards (float32) for paired completions and code tasks, and counts: ``"timeouts"``, ``"no_answer"``
    (no program found) and one count per reason of :data:`REASONS`."""
    results = code_results(completions, tasks, pool)
    rewards = np.array([1.0 if r.passed else -1.0 for r in results], np.float32)
    counts = dict.fromkeys(REASONS, 0)
    for r in results:
        counts[r.reason] = counts.get(r.reason, 0) + 1
    counts["timeouts"] = counts["timeout"]
    counts["no_answer"] = sum(r.detail == NO_PROGRAM for r in results)
    return rewards, counts


def main(argv: Sequence[str] | None = None) -> int:
    """The command line (see the module docstring). Returns the exit status."""
    ap = argparse.ArgumentParser(prog="python -m scalerl_jax.rewards.code",
                                 description="Run a program and its tests in the code sandbox; print one JSON line.")
    ap.add_argument("--program", required=True, help="the program (Python source file)")
    ap.add_argument("--tests", required=True, help="its tests: plain asserts, or check(candidate) with --entry-point")
    ap.add_argument("--entry-point", default=None, help="function passed to the tests' check(candidate)")
    ap.add_argument("--prompt", default=None,
                    help="the task's code prefix (a Python file): the tests use the helpers it defines, not the "
                         "program's")
    ap.add_argument("--timeout", type=float, default=SandboxConfig.timeout_s, help="wall clock of the run, seconds")
    ap.add_argument("--memory-mb", type=int, default=SandboxConfig.memory_mb, help="address space per process")
    ap.add_argument("--isolation", choices=ISOLATIONS, default="auto",
                    help="auto: bubblewrap, else rlimits with a warning; none runs the program unsandboxed")
    a = ap.parse_args(argv)
    texts = []
    for flag, path in (("--program", a.program), ("--tests", a.tests), ("--prompt", a.prompt)):
        if path is None:
            texts.append("")
            continue
        try:
            with open(path, encoding="utf-8") as f:
                texts.append(f.read())
        except (OSError, UnicodeDecodeError) as e:
            ap.error(f"{flag} {path}: {e}")
    try:
        cfg = SandboxConfig(timeout_s=a.timeout, cpu_s=a.timeout, memory_mb=a.memory_mb, isolation=a.isolation)
    except ValueError as e:
        ap.error(str(e))
    try:
        result = run_program(texts[0], texts[1], a.entry_point, cfg, texts[2])
    except SandboxError as e:
        result = CodeResult(False, "sandbox_error", 0.0, str(e), a.isolation)
    print(json.dumps(result.summary()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
