"""Host memory for XLA's CPU buffers: transparent huge pages through glibc's malloc.

On a CPU, XLA allocates each executable's temporary buffer afresh on every call (1.35 GB for the ``small`` preset's
train step: 256 rows x 68 tokens) and glibc hands blocks that large to ``mmap``, so every call first faults in every
4 KiB page of it: 334,000 page faults and 0.60 s of kernel CPU in a 0.92 s step, measured on 2 cores
(docs/results/loop.md). With the glibc tunable ``glibc.malloc.hugetlb=1`` (glibc 2.35+), malloc asks the kernel for
transparent huge pages (``madvise(MADV_HUGEPAGE)``) on such blocks, 2 MiB pages: 1,164 faults and 0.10 s of kernel CPU
in a 0.59 s step. The tunable is read once, when the process starts, so a process can only get it by starting again.

:func:`reexec_for_cli` does that for the project's command-line entry points: the packages ``scalerl_jax``,
``experiments`` and ``benchmarks`` call it when they are imported, and it acts only while Python is still locating
the module of a ``python -m <package>.<module>`` command (``sys.argv[0] == "-m"``) or when a console script of the
project (``scalerl-run``, ``scalerl-fit``, ...) imports its entry point, so importing the packages from a script, a
test or a notebook never restarts anything. It replaces the process (``os.execve``) with the same
command and ``GLIBC_TUNABLES`` extended by the huge-page tunable; processes the run starts (generator servers, the
forecast, the run's children) inherit it. It does nothing off glibc (macOS, musl), on glibc before 2.35, when the
kernel's transparent huge pages are off (``never``), when the tunable is already set, or with
``SCALERL_HUGEPAGES=0``.
"""

from __future__ import annotations

import os
import platform
import sys
from collections.abc import Mapping

OPT_OUT = "SCALERL_HUGEPAGES"  # "0": leave malloc as it is
TUNABLE = "glibc.malloc.hugetlb=1"
THP_ENABLED = "/sys/kernel/mm/transparent_hugepage/enabled"
# the project's console scripts (pyproject.toml, [project.scripts]; tests/test_packaging.py checks the two agree)
CONSOLE_SCRIPTS = ("scalerl-run", "scalerl-moe", "scalerl-loo", "scalerl-fit", "scalerl-prepare", "scalerl-serve")


def thp_mode(path: str = THP_ENABLED) -> str | None:
    """The kernel's transparent-huge-page mode (``always``, ``madvise`` or ``never``); None when unknown."""
    try:
        text = open(path).read()
    except OSError:
        return None
    for word in text.split():
        if word.startswith("[") and word.endswith("]"):
            return word[1:-1]
    return None


def glibc_supports_hugetlb() -> bool:
    """Whether this process runs on glibc 2.35 or newer (the first with ``glibc.malloc.hugetlb``)."""
    if sys.platform != "linux":
        return False
    lib, version = platform.libc_ver()
    if lib != "glibc":
        return False
    try:
        major, minor = (int(x) for x in version.split(".")[:2])
    except ValueError:
        return False
    return (major, minor) >= (2, 35)


def hugepage_tunables(environ: Mapping[str, str] | None = None, *, supported: bool | None = None,
                      thp: str | None = "") -> str | None:
    """The ``GLIBC_TUNABLES`` value a process should start with, or None when there is nothing to change (module
    docstring). ``supported`` and ``thp`` default to this machine's (:func:`glibc_supports_hugetlb`,
    :func:`thp_mode`). ``scripts/test.sh`` asks this for the pytest process."""
    environ = os.environ if environ is None else environ
    supported = glibc_supports_hugetlb() if supported is None else supported
    thp = thp_mode() if thp == "" else thp
    if environ.get(OPT_OUT, "1") == "0" or not supported or thp not in ("always", "madvise"):
        return None
    current = environ.get("GLIBC_TUNABLES", "")
    if "glibc.malloc.hugetlb" in current:
        return None
    return f"{current}:{TUNABLE}" if current else TUNABLE


def active(environ: Mapping[str, str] | None = None) -> bool:
    """Whether this process started with the huge-page tunable (and glibc and the kernel honour it)."""
    environ = os.environ if environ is None else environ
    return (TUNABLE in environ.get("GLIBC_TUNABLES", "").split(":") and glibc_supports_hugetlb()
            and thp_mode() in ("always", "madvise"))


def describe() -> str:
    """One line for a run's start-up log."""
    if active():
        return f"malloc on transparent huge pages ({TUNABLE}; {OPT_OUT}=0 turns it off)"
    why = ("turned off" if os.environ.get(OPT_OUT) == "0" else "not glibc 2.35+" if not glibc_supports_hugetlb()
           else f"kernel THP mode {thp_mode()!r}" if thp_mode() not in ("always", "madvise")
           else "GLIBC_TUNABLES without " + TUNABLE)
    return f"malloc on 4 KiB pages ({why})"


def _console_script(argv0: str) -> bool:
    """Whether ``argv0`` is one of the project's console scripts (``CONSOLE_SCRIPTS``)."""
    return os.path.basename(argv0) in CONSOLE_SCRIPTS


def reexec_for_cli() -> None:
    """Restart a ``python -m`` command with the huge-page tunable (module docstring); returns when it does not."""
    if not getattr(sys, "orig_argv", None) or not (sys.argv[:1] == ["-m"] or _console_script(sys.argv[0])):
        return
    tunables = hugepage_tunables()
    if tunables is None:
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], {**os.environ, "GLIBC_TUNABLES": tunables})
