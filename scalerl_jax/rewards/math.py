"""math-verify reward for real math sets: +1 when the completion's final answer equals the gold answer, else -1.

Answer extraction from a completion (:func:`completion_answer_text`): the last ``\\boxed{}`` or the text after the
last ``####`` (GSM8K style), whichever comes later; without either, math-verify's own extraction over the whole
completion (LaTeX, then plain numbers and expressions). The gold answer is parsed as ``$gold$``. Equivalence is
math-verify's (numeric, symbolic, sets, intervals, ...), so ``\\frac{1}{2}`` and ``0.5`` match.

math-verify can hang on pathological input (huge powers, deep nesting), and its own timeout uses ``signal.alarm``
which only works in the main thread. :class:`MathVerifier` therefore runs it in a separate worker process (a plain
``python -c`` child with pipes, so it works from any thread and never re-imports the caller's ``__main__``):
math-verify's alarm-based timeout handles the usual slow cases inside the worker, and the parent kills and
restarts the worker when a sample exceeds a hard limit. Both count as timeouts and score -1.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import select
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from typing import Self

import numpy as np

from scalerl_jax.data.jsonl import hash_answer, last_boxed
from scalerl_jax.data.tasks import Problem

DEFAULT_TIMEOUT_S = 5.0

# The worker only imports math_verify: parsing and verification of two strings per request, one JSON line in and
# one JSON line out. Status is "ok" (correct), "wrong", "no_answer" (nothing extracted) or "timeout".
_WORKER_SRC = r"""
import json, sys, logging
logging.disable(logging.CRITICAL)
from math_verify import parse, verify
from math_verify.errors import TimeoutException
t = int(sys.argv[1])
gold_cache = {}
def judge(pred, gold):
    try:
        g = gold_cache.get(gold)
        if g is None:
            g = parse("$" + gold + "$", parsing_timeout=t, raise_on_error=True)
            if len(gold_cache) > 100000:
                gold_cache.clear()
            gold_cache[gold] = g
        p = parse(pred, parsing_timeout=t, raise_on_error=True)
        if not p:
            return "no_answer"
        return "ok" if verify(g, p, timeout_seconds=t, raise_on_error=True) else "wrong"
    except TimeoutException:
        return "timeout"
    except Exception:
        return "wrong"
print("ready", flush=True)
for line in sys.stdin:
    req = json.loads(line)
    print(json.dumps(judge(req["pred"], req["gold"])), flush=True)
"""


def completion_answer_text(completion: str) -> str:
    """The part of a completion that math-verify should read: the final answer marked by whichever of ``####``
    (GSM8K style, the rest of that line) and ``\\boxed{...}`` comes last, else the whole completion (math-verify
    then looks for LaTeX and plain numbers itself). Earlier boxed answers are drafts: only the last one counts."""
    h_pos = completion.rfind("####")
    b_pos = max(completion.rfind("\\boxed"), completion.rfind("\\fbox"))
    if h_pos >= 0 and h_pos > b_pos:
        return hash_answer(completion) or ""
    if b_pos >= 0:
        b = last_boxed(completion)
        if b is not None:
            return "\\boxed{" + b + "}"
    return completion


_PLAIN_INT = re.compile(r"-?[0-9]+")


def _int_verdict(pred: str, gold: str) -> str | None:
    """"ok" / "wrong" when the answer (a ``\\boxed{}`` content or a bare answer) and the gold are both plain
    integers, else None (math-verify decides)."""
    p = pred.strip()
    if p.startswith("\\boxed{") and p.endswith("}"):
        p = p[len("\\boxed{"):-1].strip()
    g = gold.strip()
    if _PLAIN_INT.fullmatch(p) and _PLAIN_INT.fullmatch(g):
        return "ok" if int(p) == int(g) else "wrong"
    return None


class WorkerTimeout(RuntimeError):
    """The verification worker did not answer within the hard limit."""


class MathVerifier:
    """math-verify in a worker process with per-sample timeouts.

    ``timeout_s`` is math-verify's own limit for each parse/compare call (rounded up to whole seconds, as it uses
    ``signal.alarm``); ``hard_timeout_s`` (default ``3 * timeout_s + 2``) bounds one whole sample, after which the
    worker is killed and restarted. Use as a context manager or call :meth:`close`. Thread-safe (one request at
    a time). ``counts`` accumulates ``{"timeouts", "no_answer", "restarts"}`` over the verifier's life.
    """

    def __init__(self, timeout_s: float = DEFAULT_TIMEOUT_S, hard_timeout_s: float | None = None) -> None:
        if timeout_s <= 0:
            raise ValueError(f"MathVerifier: timeout_s must be > 0, got {timeout_s}")
        self.timeout_s = float(timeout_s)
        self.hard_timeout_s = float(hard_timeout_s if hard_timeout_s is not None else 3 * timeout_s + 2)
        self.startup_timeout_s = 120.0
        self.fast_integers = True  # compare plain-integer answers here (see judge); False: always math-verify
        self.counts = {"timeouts": 0, "no_answer": 0, "restarts": 0}
        self._proc: subprocess.Popen | None = None
        self._buf = b""
        self._lock = threading.Lock()

    # -- worker management -------------------------------------------------------------------------------------
    def _start(self) -> None:
        self._proc = subprocess.Popen(
            [sys.executable, "-c", _WORKER_SRC, str(max(1, math.ceil(self.timeout_s)))],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env={**os.environ, "PYTHONWARNINGS": "ignore"},
        )
        self._buf = b""
        if self._readline(self.startup_timeout_s) != "ready":
            raise RuntimeError("MathVerifier: the math-verify worker did not start (is math-verify installed?)")

    def _kill(self) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait()
            for stream in (self._proc.stdin, self._proc.stdout):
                stream.close()
        self._proc = None
        self._buf = b""

    def _readline(self, timeout: float) -> str:
        assert self._proc is not None
        fd = self._proc.stdout.fileno()
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise WorkerTimeout(f"no answer from the math-verify worker within {timeout:.1f} s")
            chunk = os.read(fd, 65536)
            if not chunk:
                raise WorkerTimeout("the math-verify worker exited")
            self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        return line.decode().strip().strip('"')

    def close(self) -> None:
        """Stop the worker process."""
        with self._lock:
            self._kill()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        with contextlib.suppress(OSError, AttributeError):  # interpreter shutdown may have torn things down
            self._kill()

    # -- scoring -----------------------------------------------------------------------------------------------
    def judge(self, completion: str, gold: str) -> str:
        """``"ok"``, ``"wrong"``, ``"no_answer"`` or ``"timeout"`` for one completion against a gold answer.

        When the extracted answer and the gold are both plain integers (``-?[0-9]+``, the common case on GSM8K-style
        data) they are compared as integers here, as math-verify would compare them, without the worker round trip;
        everything else goes to math-verify."""
        pred = completion_answer_text(completion)
        fast = _int_verdict(pred, gold) if self.fast_integers else None
        if fast is not None:
            status = fast
        elif not pred.strip():
            status = "no_answer"
        else:
            with self._lock:
                if self._proc is None:
                    self._start()
                try:
                    self._proc.stdin.write((json.dumps({"pred": pred, "gold": gold}) + "\n").encode())
                    self._proc.stdin.flush()
                    status = self._readline(self.hard_timeout_s)
                except (WorkerTimeout, BrokenPipeError):
                    self._kill()
                    self.counts["restarts"] += 1
                    status = "timeout"
        if status in ("timeout", "no_answer"):
            self.counts["timeouts" if status == "timeout" else "no_answer"] += 1
        return status

    def reward(self, completion: str, gold: str) -> float:
        """+1.0 when ``completion``'s final answer is equivalent to ``gold``, else -1.0."""
        return 1.0 if self.judge(completion, gold) == "ok" else -1.0

    def score(self, completions: Sequence[str], problems: Sequence[Problem]) -> tuple[np.ndarray, dict[str, int]]:
        """Rewards (float32, +1/-1) for paired completions and problems, and this batch's counts
        ``{"timeouts", "no_answer"}``."""
        if len(completions) != len(problems):
            raise ValueError(f"MathVerifier.score: {len(completions)} completions for {len(problems)} problems")
        rewards = np.empty(len(completions), np.float32)
        counts = {"timeouts": 0, "no_answer": 0}
        for k, (c, p) in enumerate(zip(completions, problems, strict=True)):
            status = self.judge(c, p.answer)
            if status == "timeout":
                counts["timeouts"] += 1
            elif status == "no_answer":
                counts["no_answer"] += 1
            rewards[k] = 1.0 if status == "ok" else -1.0
        return rewards, counts


_default: MathVerifier | None = None
_default_lock = threading.Lock()


def default_verifier() -> MathVerifier:
    """A process-wide :class:`MathVerifier` with the default timeouts, started on first use."""
    global _default
    with _default_lock:
        if _default is None:
            _default = MathVerifier()
        return _default


def math_reward(completion: str, gold: str) -> float:
    """+1.0 / -1.0 with the process-wide verifier (see :func:`default_verifier`)."""
    return default_verifier().reward(completion, gold)


def score_math(
    completions: Sequence[str], problems: Sequence[Problem], verifier: MathVerifier | None = None
) -> tuple[np.ndarray, dict[str, int]]:
    """Batch scoring with ``verifier`` (default: the process-wide one): ``(rewards, {"timeouts", "no_answer"})``."""
    return (verifier or default_verifier()).score(completions, problems)
