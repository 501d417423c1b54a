"""The code that runs in the sandbox's own processes, shipped as source to ``python -I -S -c`` (no package, no
site-packages there). Every function here is self-contained (imports inside); :func:`source` joins the helpers a
role needs with its main function. This module holds what both interpreters share (the wire protocol
:func:`_send` / :func:`_recv` / :func:`_enc` / :func:`_dec`, the rlimits, the description of an exception), their
two mains, the tests' guarded ``eval``, and :func:`source`; the tests' type-strict comparisons and the AST rewrite
that routes every comparison through them are :mod:`scalerl_jax.rewards.strict_compare`, the launcher's code is
:mod:`scalerl_jax.rewards.launcher`: :func:`source` carries their functions the same way.

One run has two sandboxed interpreters that never share memory, plus the trainer's side:

- the **program** process (:func:`_program_main`) runs the model's program, then serves calls: it receives a
  function name and arguments, calls the program's function and sends back the result as a plain value
  (:func:`_enc`), an exception as its type name and message, or "not a plain value";
- the **tests** process (:func:`_tests_main`) runs the task's tests with every name they take from the program bound
  to a proxy that forwards the call to the program process. Values come back rebuilt by :func:`_dec` as exact
  ``None``/``bool``/``int``/``float``/``str``/``bytes``/``list``/``tuple``/``dict``/``set``/``frozenset`` objects, so
  an object with its own ``__eq__``, ``__bool__`` or ``__hash__`` never reaches a comparison, and every comparison
  the tests make is type-strict (:func:`~scalerl_jax.rewards.strict_compare._strict_cmp`: the tests' AST is
  rewritten; ``math.isclose`` and ``unittest``'s assertions are replaced). The task's prompt defines its helpers
  here; ``eval`` / ``exec`` / ``compile`` of text the tests did not write accept literals and arithmetic only
  (:func:`_guarded_builtins`). Only this process writes the verdict, on a pipe the program process does not hold,
  after the tests ran; the program never sees the tests' source or their expected values;
- the **launcher** (:mod:`scalerl_jax.rewards.launcher`) sits between the trainer and each of the two: it drops
  root to the run's uid and execs bubblewrap, or, in the rlimits mode, confines the interpreter itself and kills
  its whole process tree at the end.
"""

from __future__ import annotations

import functools
import inspect
import textwrap

from scalerl_jax.rewards.launcher import _landlock, _launcher_main, _no_sockets, _seccomp_program, _write
from scalerl_jax.rewards.strict_compare import (
    _canon,
    _dict_key,
    _no_bool,
    _no_collision,
    _orderable,
    _ordered,
    _plain,
    _strict_binop,
    _strict_builtins,
    _strict_chain,
    _strict_cmp,
    _strict_eq,
    _strict_in,
    _strict_isclose,
    _strict_item,
    _strict_method,
    _strict_names,
    _strict_rewrite,
    _strict_unary,
    _strict_unittest,
    _Unsound,
)


def _send(fd: int, data: bytes) -> None:
    """Write ``data`` to ``fd`` as one length-prefixed message."""
    import os

    data = len(data).to_bytes(8, "big") + data
    while data:
        data = data[os.write(fd, data):]


def _recv(fd: int, cap: int = 8 << 20) -> bytes:
    """Read one message :func:`_send` wrote; EOFError at the end, OverflowError over ``cap`` bytes."""
    import os

    def read_exactly(n: int) -> bytes:
        out = bytearray()
        while len(out) < n:
            chunk = os.read(fd, min(n - len(out), 1 << 20))
            if not chunk:
                raise EOFError
            out += chunk
        return bytes(out)

    n = int.from_bytes(read_exactly(8), "big")
    if n > cap:
        raise OverflowError(f"a message of {n} bytes (at most {cap})")
    return read_exactly(n)


def _enc(v, depth: int = 0):
    """``v`` as nested lists of literals (sent as ``repr``, read back with ``ast.literal_eval``) if it is a plain
    value of an exact plain type (no subclass), else TypeError."""
    t = type(v)
    if depth > 200:
        raise TypeError("nested over 200 levels")
    if v is None or t is bool or t is str:
        return v
    if t is int:
        return v if -(1 << 62) < v < 1 << 62 else ["I", format(v, "x")]
    if t is float:
        return v if v == v and v not in (float("inf"), float("-inf")) else ["F", repr(v)]
    if t is bytes:
        return ["b", v.hex()]
    tag = {list: "l", tuple: "t", set: "s", frozenset: "f"}.get(t)
    if tag is not None:
        return [tag, [_enc(x, depth + 1) for x in v]]
    if t is dict:
        return ["d", [[_enc(k, depth + 1), _enc(x, depth + 1)] for k, x in v.items()]]
    # The standard library's containers that compare equal to plain values cross as those values: their contents,
    # read with the base type's own methods (a subclass's overrides never run), so a program gains nothing by
    # imitating one.
    if isinstance(v, dict) and getattr(t, "__module__", None) == "collections":  # Counter, OrderedDict, defaultdict
        return ["d", [[_enc(k, depth + 1), _enc(x, depth + 1)] for k, x in dict.items(v)]]
    if isinstance(v, tuple) and isinstance(getattr(t, "_fields", None), tuple):  # a namedtuple
        return ["t", [_enc(x, depth + 1) for x in tuple.__iter__(v)]]
    if getattr(t, "__module__", None) == "collections" and getattr(t, "__name__", None) in (
            "UserDict", "UserList", "UserString"):
        return _enc(object.__getattribute__(v, "data"), depth + 1)
    raise TypeError(t.__name__ if isinstance(t.__name__, str) else "?")


def _dec(x, depth: int = 0):
    """The plain value :func:`_enc` encoded; ValueError on anything else (the data may come from the program)."""
    t = type(x)
    if depth > 200:
        raise ValueError("nested over 200 levels")
    if x is None or t in (bool, int, float, str):
        return x
    if t is list and len(x) == 2 and type(x[0]) is str:
        tag, body = x
        if tag == "I" and type(body) is str:
            return int(body, 16)
        if tag == "F" and body in ("nan", "inf", "-inf"):
            return float(body)
        if tag == "b" and type(body) is str:
            return bytes.fromhex(body)
        kind = {"l": list, "t": tuple, "s": set, "f": frozenset}.get(tag)
        if kind is not None and type(body) is list:
            return kind(_dec(e, depth + 1) for e in body)
        if tag == "d" and type(body) is list and all(type(p) is list and len(p) == 2 for p in body):
            return {_dec(k, depth + 1): _dec(v, depth + 1) for k, v in body}
    raise ValueError("malformed value from the program process")


def _set_limits(lim) -> None:
    """The run's rlimits. RLIMIT_NPROC counts every task of the real uid (in the innermost user namespace), so the
    allowance comes on top of those."""
    import contextlib
    import os
    import resource as r

    if lim is None:
        return
    # The launcher knows when this process is its uid's only task (a fresh uid; a user namespace of its own, where
    # the kernel counts per namespace): then no scan of the host's /proc.
    known = os.environ.get("SANDBOX_ONLY_TASK") == "1"
    tasks = 1 if known else 0
    for d in filter(str.isdigit, () if known else os.listdir("/proc")):
        with contextlib.suppress(OSError, ValueError, KeyError), open(f"/proc/{d}/status") as f:
            st = dict(line.split(":", 1) for line in f if ":" in line)
            tasks += int(st["Threads"]) if int(st["Uid"].split()[0]) == os.getuid() else 0
    for res, soft, hard in ((r.RLIMIT_NPROC, tasks + lim["procs"], 0), (r.RLIMIT_AS, lim["as"], 0),
                            (r.RLIMIT_FSIZE, lim["fsize"], 0), (r.RLIMIT_NOFILE, lim["nofile"], 0),
                            (r.RLIMIT_CORE, 0, 0), (r.RLIMIT_CPU, lim["cpu"], lim["cpu"] + 1)):
        hard, top = hard or soft, r.getrlimit(res)[1]
        if top != r.RLIM_INFINITY:  # an unprivileged process cannot raise its hard limit
            soft, hard = min(soft, top), min(hard, top)
        r.setrlimit(res, (soft, hard))


def _message(e: BaseException) -> str:
    """``str(e)``, at most 500 characters, even for an exception of the program's own making."""
    try:
        return str.__str__(str(e))[:500]
    except BaseException:  # noqa: BLE001 -- an exception of the program's own making
        return "<unprintable>"


def _describe(e: BaseException, name: str, text: str) -> str:
    """``Type: message (name line N: source line)`` for an exception raised in the file ``name`` holding ``text``;
    for one the program raised in a call, the program's own description."""
    program = getattr(e, "_program_describes", None)
    if type(program) is str:
        return program
    msg = _message(e)
    where, tb = (f" ({e.filename} line {e.lineno})" if isinstance(e, SyntaxError) else ""), e.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == name:
            lines, n = text.splitlines(), tb.tb_lineno
            where = f" ({name} line {n}: {lines[n - 1].strip()[:200] if 0 < n <= len(lines) else ''})"
        tb = tb.tb_next
    return f"{type(e).__name__}: {msg}{where}" if msg else f"{type(e).__name__}{where}"


def _program_main() -> None:
    """The program process (argv: request fd, reply fd; stdin: the job as JSON). Runs the program, then answers
    the tests process until it says ``end`` or goes away. Nothing it sends can be more than a plain value."""
    import marshal
    import os
    import sys

    fd_in, fd_out = int(sys.argv[1]), int(sys.argv[2])
    with open(0, "rb", closefd=False) as f:
        job = marshal.loads(f.read())
    with open("/dev/null", "rb") as f:
        os.dup2(f.fileno(), 0)
    _set_limits(job["limits"])
    program, send, recv, loads = job["program"], _send, _recv, marshal.loads
    import builtins
    import types
    builtin_types = types.SimpleNamespace(**{k: v for k, v in vars(builtins).items() if isinstance(v, type)})
    del job
    ns = {"__name__": "__sandbox__", "__builtins__": __builtins__}
    error = None
    try:
        exec(compile(program, "program.py", "exec"), ns)  # noqa: S102 -- running the program is the point
    except BaseException as e:  # noqa: BLE001 -- SystemExit and KeyboardInterrupt fail the program too
        error = ["error", type(e).__name__, _describe(e, "program.py", program)]

    def answer(msg):
        if msg[0] == "names":
            out = {}
            for n in msg[1]:
                if n not in ns:
                    out[n] = "missing"
                elif type(ns[n]).__name__ == "module" and isinstance(getattr(ns[n], "__name__", None), str):
                    out[n] = ["module", ns[n].__name__]  # the tests import it themselves
                elif callable(ns[n]):
                    out[n] = "fn"
                else:
                    try:
                        out[n] = ["val", _enc(ns[n])]
                    except TypeError as e:
                        out[n] = ["opaque", str(e)]
            return ["names", out]
        fn = ns.get(msg[1])
        try:
            value = fn(*_dec(msg[2]), **_dec(msg[3]))
        except BaseException as e:  # noqa: BLE001 -- reported to the tests by type name and message
            base = next((c.__name__ for c in type(e).__mro__ if getattr(builtin_types, c.__name__, None) is c),
                        "Exception")
            return ["raise", type(e).__name__, _message(e), _describe(e, "program.py", program), base]
        try:
            return ["ok", _enc(value)]
        except TypeError as e:
            return ["opaque", str(e)]

    while True:
        try:
            msg = loads(recv(fd_in))  # from the tests process: trusted
        except (EOFError, OSError):
            os._exit(0)
        if msg[0] == "end":
            os._exit(0)
        try:
            send(fd_out, repr(error or answer(msg)).encode("utf-8", "surrogatepass"))
        except MemoryError:
            send(fd_out, b"['raise', 'MemoryError', 'MemoryError (while sending the result)']")
        except (OSError, ValueError, RecursionError) as e:
            send(fd_out, repr(["opaque", f"unsendable: {type(e).__name__}"]).encode())


def _guarded_builtins(own_code: set) -> dict:
    """The builtins the tests run with: the standard ones with the comparing ones type-strict
    (:func:`~scalerl_jax.rewards.strict_compare._strict_builtins`), ``eval`` / ``exec`` / ``compile`` guarded.
    ``own_code``: the tests' own string constants (the caller fills it once the tests are parsed), which run as
    written, their comparisons type-strict as the tests' own."""
    import ast
    import builtins
    import sys

    def guarded(real, what: str):
        """``eval`` / ``exec`` / ``compile`` for the tests: their own code strings run as written (comparisons
        rewritten as in the tests, :func:`_strict_rewrite`); any other text (a value the program returned, or one
        built from it) only if it is literals and arithmetic, evaluated with no names, attributes or calls
        reachable, so nothing it says can reach this interpreter's verdict, its arithmetic and comparisons
        type-strict."""
        allowed = (ast.Expression, ast.Constant, ast.BinOp, ast.UnaryOp, ast.BoolOp, ast.Compare, ast.Tuple, ast.List,
                   ast.Set, ast.Dict, ast.operator, ast.unaryop, ast.boolop, ast.cmpop, ast.expr_context)

        def run(source, *args, **kwargs):
            if type(source) in (str, bytes) and source not in own_code:
                text = source.decode("utf-8", "replace") if type(source) is bytes else source
                try:
                    tree = ast.parse(text.strip(), "<program's value>", "eval")
                except SyntaxError as e:
                    raise SyntaxError(f"{what}() of a text that is not literals and arithmetic: {e.msg}") from None
                bad = next((type(n).__name__ for n in ast.walk(tree) if not isinstance(n, allowed)), None)
                if bad is not None or what == "exec":
                    raise ValueError(f"{what}() of a text the tests did not write: only literals and arithmetic "
                                     f"are evaluated (found {bad or 'exec'})")
                code = real_compile(_strict_rewrite(tree), "<program's value>", "eval")
                if what == "compile":
                    return code
                return real_eval(code, {"__builtins__": {}, **_strict_names()}, {})
            if what == "compile":
                mode = args[1] if len(args) > 1 else kwargs.get("mode")
                if type(source) in (str, bytes) and len(args) <= 2 and set(kwargs) <= {"filename", "mode"} \
                        and mode in ("eval", "exec", "single"):
                    name = args[0] if args else kwargs.get("filename", "<string>")
                    return real_compile(_strict_rewrite(ast.parse(source, name, mode)), name, mode)
                return real(source, *args, **kwargs)
            if not args and "globals" not in kwargs:  # the caller's scope, as the builtin's
                caller = sys._getframe(1)
                args = (caller.f_globals, caller.f_locals)
            scope = args[0] if args else kwargs.get("globals")
            if type(scope) is dict:
                scope.setdefault("__builtins__", safe)
                for k, v in _strict_names().items():
                    scope.setdefault(k, v)
            if type(source) in (str, bytes):  # eval() ignores leading blanks, as the parser in eval mode does not
                text = source.lstrip(b" \t" if type(source) is bytes else " \t") if what == "eval" else source
                source = real_compile(_strict_rewrite(ast.parse(text, "<tests' code>", what)), "<tests' code>", what)
            return real(source, *args, **kwargs)

        run.__name__ = what
        return run

    real_eval, real_compile = eval, compile
    safe = dict(vars(builtins))
    _strict_builtins(safe)
    safe.update(eval=guarded(eval, "eval"), exec=guarded(exec, "exec"), compile=guarded(compile, "compile"))
    return safe


def _tests_main() -> None:
    """The tests process (argv: verdict fd, request fd, reply fd; stdin: the job as JSON). Runs the tests against
    proxies of the program's names; only this process writes the verdict."""
    import ast
    import builtins
    import marshal
    import os
    import sys

    fd_verdict, fd_req, fd_rep = map(int, sys.argv[1:4])
    with open(0, "rb", closefd=False) as f:
        job = marshal.loads(f.read())
    with open("/dev/null", "rb") as f:
        os.dup2(f.fileno(), 0)
    _set_limits(job["limits"])
    tests, entry = job["tests"], job["entry_point"]

    def verdict(reason: str, detail: str) -> None:
        body = detail.encode("utf-8", "backslashreplace")[:2000].replace(b"\n", b" ").replace(b"\t", b" ")
        os.write(fd_verdict, reason.encode() + b"\t" + body + b"\n")
        try:
            _send(fd_req, marshal.dumps(["end"]))
        except OSError:
            pass
        os._exit(0)

    class Gone(BaseException):
        """The program process ended or broke the protocol."""

    class NotPlain(BaseException):
        """The program answered with something that is not a plain value."""

    class ProgramError(BaseException):
        """The program itself raised before any test ran."""

    def exchange(msg):
        try:
            _send(fd_req, marshal.dumps(msg))
            raw = _recv(fd_rep)
        except (EOFError, OSError) as e:
            raise Gone("the program's process ended during the tests") from e
        except OverflowError as e:
            raise NotPlain(f"the program's reply was malformed: {e}") from e
        try:  # from the program: parsed as literals only
            return ast.literal_eval(raw.decode("utf-8", "surrogatepass"))
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError, UnicodeDecodeError) as e:
            raise NotPlain(f"the program's reply was malformed: {type(e).__name__}") from None

    def rebuild(name, text: str, base, fn: str) -> BaseException:
        """The program's exception as one of the tests' interpreter: a builtin exception type by its name, else a
        class of that name under the program's builtin base (a ValueError subclass stays a ValueError). An
        exception of the iteration protocol (StopIteration, StopAsyncIteration) becomes a RuntimeError, as PEP 479
        does for generators: raised in a call the tests make from map(), zip(), filter() or all(), it would end the
        tests' own loop early."""
        def builtin(n):
            c = getattr(builtins, n, None) if type(n) is str else None
            return c if isinstance(c, type) and issubclass(c, Exception) else None

        cls = builtin(name) or builtin(base) or Exception
        if issubclass(cls, (StopIteration, StopAsyncIteration)):
            return RuntimeError(f"the program's {fn}() raised {name if type(name) is str else cls.__name__}: {text}")
        if cls.__name__ != name:
            cls = type(name if type(name) is str and name.isidentifier() else "ProgramException", (cls,), {})
        try:
            return cls(text)
        except Exception:  # noqa: BLE001 -- an exception type with another signature
            return type(cls.__name__, (Exception,), {})(text)

    def proxy(name: str):
        def call(*args, **kwargs):
            try:
                req = ["call", name, _enc(list(args)), _enc(kwargs)]
            except TypeError as e:
                raise TypeError(f"the tests passed a {e} to the program's {name}(); only plain values cross") from None
            rep = exchange(req)
            if type(rep) is not list or len(rep) < 2 or rep[0] not in ("ok", "raise", "opaque", "error"):
                raise NotPlain("the program's reply was malformed")
            if rep[0] == "ok":
                try:
                    return _dec(rep[1])
                except (ValueError, TypeError, IndexError) as e:
                    raise NotPlain(f"the program's reply was malformed: {e}") from None
            if rep[0] == "opaque":
                raise NotPlain(f"the program's {name}() returned a {rep[1]}, not a plain value (None, bool, int, "
                               "float, str, bytes, list, tuple, dict, set)")
            if rep[0] == "error":
                raise ProgramError(str(rep[2]))
            e = rebuild(rep[1], str(rep[2])[:2000], rep[4] if len(rep) > 4 else None, name)
            e._program_describes = str(rep[3] if len(rep) > 3 else rep[2])[:2000]
            raise e

        call.__name__ = call.__qualname__ = name
        return call

    own_code = set()  # the tests' own string constants: code the tests may eval / exec / compile as written
    safe_builtins = _guarded_builtins(own_code)

    try:
        tree = ast.parse(tests, "tests.py")
    except SyntaxError as e:
        verdict("failed", _describe(e, "tests.py", tests))
    bound, loads = set(), set()
    code_strings = []  # the tests' own strings that parse as code (for eval / exec): the names they use count too
    for n in ast.walk(tree):
        if isinstance(n, ast.Constant) and type(n.value) is str and len(n.value) < 65536:
            try:
                code_strings.append(ast.parse(n.value.strip(), "<tests' code>"))
            except (SyntaxError, ValueError):
                pass
    for n in (m for t in (tree, *code_strings) for m in ast.walk(t)):
        if isinstance(n, ast.Name):
            (loads if isinstance(n.ctx, ast.Load) else bound).add(n.id)
        elif isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(n.name)
        elif isinstance(n, ast.arg):
            bound.add(n.arg)
        elif isinstance(n, (ast.Import, ast.ImportFrom)):
            bound.update((a.asname or a.name).split(".")[0] for a in n.names)
        elif isinstance(n, ast.ExceptHandler) and n.name:
            bound.add(n.name)
    # The task's prompt (HumanEval's defines helpers such as poly or encode_cyclic, which the tests call): its
    # definitions run here, so the tests call the task's helpers, never the program's. Left to the program: the
    # entry point, the prompt's last function (the one the completion continues or replaces), and stubs (a body of
    # only a docstring, pass or ...). A prompt that is not a whole module (a prefix the completion continues
    # mid-statement) defines what its complete top-level statements before the unfinished one define; the
    # unfinished statement is the program's.
    helpers, prompt_tree, whole = set(), None, True
    if job.get("prompt"):
        try:
            prompt_tree = ast.parse(job["prompt"], "prompt.py")
        except SyntaxError:
            lines, whole = job["prompt"].splitlines(keepends=True), False
            for cut in range(len(lines) - 1, 0, -1):
                word = lines[cut].split(None, 1)[0].rstrip(":") if lines[cut].strip() else ""
                if lines[cut][:1] in (" ", "\t", "#", ")", "]", "}") or not word or word in (
                        "else", "elif", "except", "finally", "case"):
                    continue
                try:
                    prompt_tree = ast.parse("".join(lines[:cut]), "prompt.py")
                    break
                except SyntaxError:
                    continue
    if prompt_tree is not None:
        def stub(f) -> bool:
            return all(isinstance(b, ast.Pass) or isinstance(b, ast.Expr) and isinstance(b.value, ast.Constant)
                       and (type(b.value.value) is str or b.value.value is Ellipsis) for b in f.body)

        defs = (ast.FunctionDef, ast.AsyncFunctionDef)
        last = next((n for n in reversed(prompt_tree.body) if isinstance(n, defs)), None) if whole else None
        prompt_tree.body = [n for n in prompt_tree.body
                            if not (isinstance(n, defs) and (n is last or n.name == entry or stub(n)))]
        for n in prompt_tree.body:
            if isinstance(n, (*defs, ast.ClassDef)):
                helpers.add(n.name)
            elif isinstance(n, (ast.Import, ast.ImportFrom)):
                helpers.update((a.asname or a.name).split(".")[0] for a in n.names)
            elif isinstance(n, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                helpers.update(t.id for t in ast.walk(n) if isinstance(t, ast.Name) and isinstance(t.ctx, ast.Store))
        helpers.discard(entry)
        prompt_tree = _strict_rewrite(prompt_tree)
    wanted = sorted((loads - bound - helpers - set(dir(builtins))) | ({entry} if entry else set()))
    if entry and "check" not in bound:
        verdict("failed", "the tests define no check(candidate)")
    own_code.update(n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and type(n.value) in (str, bytes))
    tree = _strict_rewrite(tree)
    import cmath
    import math

    math.isclose, cmath.isclose = _strict_isclose(math.isclose), _strict_isclose(cmath.isclose)
    math.fabs, math.floor, math.ceil, math.trunc = map(_no_bool, (math.fabs, math.floor, math.ceil, math.trunc))
    if "unittest" in tests:
        _strict_unittest()
    ns = {"__name__": "__tests__", "__builtins__": safe_builtins, **_strict_names()}
    if prompt_tree is not None:
        try:
            exec(compile(prompt_tree, "prompt.py", "exec"), ns)  # noqa: S102 -- the task's own prompt
        except BaseException as e:  # noqa: BLE001 -- a task whose prompt does not run here: its helpers are missing
            verdict("failed", "the task's prompt does not run in the tests' interpreter: " +
                    _describe(e, "prompt.py", job["prompt"]))
    try:
        rep = exchange(["names", wanted])
        if type(rep) is not list or len(rep) < 2 or rep[0] not in ("names", "error"):
            raise NotPlain("the program's reply was malformed")
        if rep[0] == "error":
            verdict("memory" if rep[1] == "MemoryError" else "failed", str(rep[2]))
        for n, kind in rep[1].items():
            if n not in wanted:
                continue
            if kind == "fn":
                ns[n] = proxy(n)
            elif type(kind) is list and kind[0] == "val":
                ns[n] = _dec(kind[1])
            elif type(kind) is list and kind[0] == "module" and type(kind[1]) is str:
                try:
                    __import__(kind[1])
                    ns[n] = sys.modules[kind[1]]
                except ImportError:
                    pass
        if entry and ns.get(entry) is None:
            verdict("failed", f"the program defines no {entry!r}")
        exec(compile(tree, "tests.py", "exec"), ns)  # noqa: S102 -- the task's own tests
        if entry:
            ns["check"](ns[entry])
        if _Unsound.seen:  # raised, then caught by the tests
            raise _Unsound(_Unsound.seen)
    except Gone as e:
        verdict("crash", str(e))
    except (NotPlain, ProgramError) as e:
        verdict("failed", str(e))
    except MemoryError as e:
        verdict("memory", _describe(e, "tests.py", tests))
    except BaseException as e:  # noqa: BLE001 -- any failure of the tests fails the program
        verdict("failed", _describe(e, "tests.py", tests))
    verdict("passed", "")


_ROLES = {"program": (_send, _recv, _enc, _dec, _set_limits, _message, _describe, _program_main),
          "tests": (_send, _recv, _enc, _dec, _Unsound, _plain, _canon, _strict_eq, _ordered, _strict_in, _strict_cmp,
                    _strict_chain, _orderable, _dict_key, _no_collision, _strict_item, _strict_method, _strict_binop,
                    _strict_builtins, _no_bool, _strict_unary, _strict_names, _strict_rewrite, _strict_isclose,
                    _strict_unittest, _set_limits, _message, _describe, _guarded_builtins, _tests_main),
          "launcher": (_write, _landlock, _seccomp_program, _no_sockets, _launcher_main)}


@functools.cache
def source(role: str) -> str:
    """The source ``python -I -S -c`` runs for ``role``: ``"program"``, ``"tests"`` or ``"launcher"``."""
    fns = _ROLES[role]
    body = "\n\n".join(textwrap.dedent(inspect.getsource(f)) for f in fns)
    return "from __future__ import annotations\n\n" + body + f"\n\n{fns[-1].__name__}()\n"
