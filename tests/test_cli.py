"""The command lines (tyro over the frozen config dataclasses): every config field is a flag whose ``--help`` entry
shows its type and its doc; a wrong type, a value outside a field's choices or an unknown field exits 2 naming the
field and what it accepts; ``--set FIELD=VALUE`` is an alias of the field's flag; every command documented in the
README, BUILD.md, docs/*.md, the scripts in examples/ and the entry points' docstrings still parses
(``--print-config`` or ``--help``).

Everything runs in process (a subprocess that imports JAX costs seconds), except one check of the real command.
"""

import ast
import dataclasses
import io
import os
import re
import shlex
import subprocess
import sys
import tokenize
import types
import typing
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest
from scalerl_jax.experiments import cli, loo, math_8b, scout_moe
from scalerl_jax.experiments.presets import PRESETS, build_plan

from scalerl_jax import config, fit, serve
from scalerl_jax.config import ExperimentConfig
from tests.conftest import HANG_S

ROOT = Path(__file__).resolve().parents[1]
MAINS = {"experiments.math_8b": math_8b.main, "experiments.scout_moe": scout_moe.main, "experiments.loo": loo.main,
         "scalerl_jax.serve": serve.main, "scalerl_jax.fit": fit.main}
DEFAULT_PRESET = {"experiments.math_8b": "tiny", "experiments.scout_moe": "tiny_moe", "experiments.loo": "tiny"}


@pytest.fixture(autouse=True)
def _wide_terminal(monkeypatch):
    monkeypatch.setenv("COLUMNS", "120")  # tyro lays --help out for the terminal: one column at this width


def _run(main, argv: list[str]) -> tuple[int, str, str]:
    """``main(argv)`` in process: (exit status, stdout, stderr), whether it returned or exited."""
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 1
    return code, out.getvalue(), err.getvalue()


def _flat(text: str) -> str:
    """Help or error text without its box drawing, on one line with single spaces."""
    return " ".join(re.sub(r"[│╭╮╰╯─•]", " ", text).split())


def _help_entries(text: str) -> dict[str, str]:
    """``--flag`` -> its whole help entry (flag line and the description lines under it), box drawing removed."""
    entries: dict[str, str] = {}
    cur = None
    for raw in text.splitlines():
        line = raw.strip().strip("│").strip()
        if m := re.match(r"(--?[a-z][\w.-]*)", line):
            cur = m.group(1)
            entries[cur] = line
        elif cur and line and line[0] not in "╭╰─" and not line.startswith("---"):
            entries[cur] += " " + line
        else:
            cur = None
    return {k: _flat(v) for k, v in entries.items()}


# ---- what config.py documents, read independently of tyro ------------------------------------------------------


def _config_field_docs() -> dict[tuple[str, str], str]:
    """(class name, field) -> the comment config.py gives the field: its trailing ``# ...`` or the ``#:`` lines
    right above it."""
    src = (ROOT / "scalerl_jax" / "config.py").read_text()
    comments = {t.start[0]: t.string for t in tokenize.generate_tokens(io.StringIO(src).readline)
                if t.type == tokenize.COMMENT}
    lines = src.splitlines()
    docs = {}
    for node in ast.parse(src).body:
        if not isinstance(node, ast.ClassDef):
            continue
        for stmt in node.body:
            if not isinstance(stmt, ast.AnnAssign):
                continue
            n = stmt.lineno
            if n in comments and lines[n - 1].lstrip() != comments[n]:
                docs[node.name, stmt.target.id] = comments[n].lstrip("#: ").strip()
            else:
                above = []
                while n - 1 - len(above) in comments and comments[n - 1 - len(above)].startswith("#:"):
                    above.insert(0, comments[n - 1 - len(above)][2:].strip())
                docs[node.name, stmt.target.id] = " ".join(above)
    return docs


CONFIG_DOCS = _config_field_docs()


def _leaf_fields(cfg, prefix: str = ""):
    """(dotted path, class name, field, annotated type) of every field tyro turns into a flag, for this instance."""
    hints = typing.get_type_hints(type(cfg))
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        if dataclasses.is_dataclass(value):
            yield from _leaf_fields(value, f"{prefix}{f.name}.")
        elif not any(dataclasses.is_dataclass(t) for t in typing.get_args(hints[f.name])):  # None optional section
            yield f"{prefix}{f.name}", type(cfg).__name__, f.name, hints[f.name]


def _type_shown(typ) -> str:
    """How tyro writes a field's type in --help."""
    union = typing.get_args(typ) if typing.get_origin(typ) in (typing.Union, types.UnionType) else (typ,)

    def one(t) -> str:
        if typing.get_origin(t) is typing.Literal:
            return "{" + ",".join(map(str, typing.get_args(t))) + "}"
        if typing.get_origin(t) is tuple:
            item = typing.get_args(t)[0].__name__.upper()
            return f"[{item} [{item} ...]]"
        return t.__name__.upper()

    if set(union) == {bool, type(None)}:  # an optional flag: tyro lists the three choices
        return "{None,True,False}"
    shown = "|".join(one(t) for t in union if t is not type(None))  # e.g. INT|{auto} for a number or "auto"
    return ("{None}|" + shown) if type(None) in union else shown


def test_the_config_docs_reader_sees_every_field():
    missing = [k for k, v in CONFIG_DOCS.items() if not v and k[1] not in ("model", "mesh", "loss", "rollout", "data",
                                                                          "train", "length")]
    assert not missing, f"config fields without a doc comment: {missing}"


@pytest.mark.parametrize("module, preset", [("experiments.math_8b", "tiny"), ("experiments.math_8b", "8b"),
                                            ("experiments.scout_moe", "tiny_moe"), ("experiments.loo", "tiny")])
def test_help_lists_every_config_field_with_its_type_and_doc(module, preset):
    code, out, _ = _run(MAINS[module], ["--preset", preset, "--help"])
    assert code == 0
    entries = _help_entries(out)
    exp = build_plan(preset).exp
    checked = 0
    for path, cls, name, typ in _leaf_fields(exp):
        flag = "--" + path.replace("_", "-")
        assert flag in entries, f"{module} --help lacks {flag}"
        entry = entries[flag]
        if typ is bool:
            head, _, last = flag.rpartition(".")
            assert f"{flag}, {head}.no-{last}" in entry or f"{flag}, --no-{last[2:]}" in entry, entry
        else:
            assert f"{flag} {_type_shown(typ)}" in entry, entry
        doc = _flat(CONFIG_DOCS[cls, name])
        assert doc and doc in entry, f"{flag}: doc {doc!r} not in {entry!r}"
        checked += 1
    assert checked >= 80
    if preset == "8b":  # an optional section the preset fills is settable field by field
        assert "--model.rope-scaling.factor FLOAT" in entries["--model.rope-scaling.factor"]


@pytest.mark.parametrize("module, args_type", [("experiments.math_8b", cli.RunArgs),
                                               ("experiments.loo", loo.LooArgs),
                                               ("scalerl_jax.serve", serve.ServeArgs),
                                               ("scalerl_jax.fit", fit.FitArgs)])
def test_help_lists_every_flag_of_the_entry_point_with_a_doc(module, args_type):
    code, out, _ = _run(MAINS[module], ["--help"])
    assert code == 0
    entries = _help_entries(out)
    for f in dataclasses.fields(args_type):
        if f.name in ("exp", "run_dirs"):
            continue
        flag = "--" + f.name.replace("_", "-")
        entry = entries.get(flag) or next((e for e in entries.values() if f", {flag} " in e), None)  # an alias
        assert entry, f"{module} --help lacks {flag}"
        doc_words = entry.split("(default:")[0].split()
        assert len(doc_words) >= 4, f"{flag} has no doc: {entry!r}"
    if module == "scalerl_jax.fit":
        assert "RUN_DIR [RUN_DIR ...]" in out
    if module == "scalerl_jax.serve":
        assert "--model-path DIR, --model DIR" in entries["--model-path"]


ERRORS = [  # (entry point, arguments, what the message must name)
    ("experiments.math_8b", ["--preset", "tiny", "--train.lr", "abc"], ["--train.lr", "FLOAT", "'abc'"]),
    ("experiments.math_8b", ["--preset", "tiny", "--set", "train.lr=abc"], ["--train.lr", "FLOAT"]),
    ("experiments.math_8b", ["--preset", "tiny", "--loss.kind", "ppo"],
     ["'ppo'", "--loss.kind", "'cispo', 'gspo', 'dapo', 'grpo'"]),
    ("experiments.math_8b", ["--preset", "tiny", "--data.n-trian", "5"], ["--data.n-trian", "--data.n-train"]),
    ("experiments.math_8b", ["--preset", "tiny", "--set", "data.n_trian=5"],
     ["DataConfig has no field 'n_trian'", "n_train"]),
    ("experiments.math_8b", ["--preset", "tiny", "--set", "trian.lr=5"], ["ExperimentConfig has no field 'trian'"]),
    ("experiments.math_8b", ["--preset", "tiny", "--set", "data.npr=maybe"], ["data.npr is a bool", "false"]),
    ("experiments.math_8b", ["--preset", "tiny", "--set", "train.lr"], ["expected FIELD=VALUE"]),
    ("experiments.math_8b", ["--preset", "tiny", "--rollout.k", "0"], ["RolloutConfig.k must be >= 1"]),
    ("experiments.math_8b", ["--preset", "huge"],
     ["--preset 'huge'", "tiny, smoke, small, tiny_mathcode, tiny_chain, 1b, gpu_rl, 8b"]),
    ("experiments.math_8b", ["--variant", "no_fun"], ["'no_fun'", "--variant", "'no_npr'"]),
    ("experiments.math_8b", ["--preset", "tiny", "--generators", "two"], ["--generators", "INT"]),
    ("experiments.math_8b", ["--preset", "tiny", "--sglang-urls", "http://a:1", "--generators", "2"], ["not both"]),
    ("experiments.scout_moe", ["--preset", "tiny", "--steps", "1"], ["--preset 'tiny'", "tiny_moe, smoke_moe, scout"]),
    ("experiments.loo", ["--variants", "scalerl", "nope"], ["'nope'", "--variants"]),
    ("experiments.loo", ["--seeds", "two"], ["--seeds", "INT"]),
    ("experiments.loo", ["--fit-until", "0"], ["--fit-until is a fraction"]),
    ("scalerl_jax.serve", ["--preset", "tiny", "--port", "http"], ["--port", "INT", "'http'"]),
    ("scalerl_jax.serve", ["--preset", "tiny", "--log-level", "loud"], ["'loud'", "--log-level", "'debug'"]),
    ("scalerl_jax.serve", ["--preset", "tiny", "--prot", "1"], ["--prot", "--port"]),
    ("scalerl_jax.serve", ["--preset", "tiny", "--model", "x"], ["--preset", "--model", "not allowed together"]),
    ("scalerl_jax.serve", ["--port", "1"], ["--preset", "--model"]),
    ("scalerl_jax.fit", ["run", "--out", "o", "--fit-until", "half"], ["--fit-until", "FLOAT"]),
    ("scalerl_jax.fit", ["run", "--out", "o", "--compute-key", "gpu_hours"], ["'gpu_hours'", "'device_hours'"]),
    ("scalerl_jax.fit", ["run"], ["--out"]),
    ("scalerl_jax.fit", ["--out", "o"], ["RUN_DIR"]),
]


@pytest.mark.parametrize("module, argv, named", ERRORS, ids=[f"{m.split('.')[-1]}:{' '.join(a)}" for m, a, _ in ERRORS])
def test_a_bad_command_exits_2_naming_the_field_and_what_it_accepts(module, argv, named):
    code, _, err = _run(MAINS[module], [*argv, "--print-config"])
    assert code == 2
    msg = _flat(err)
    for s in named:
        assert s in msg, f"{s!r} not in {msg!r}"


def test_set_is_an_alias_of_the_field_flags():
    def exp_of(*argv):
        args, _ = cli.parse_run_args(list(argv), "tiny", "scalerl", 0, presets=PRESETS, prog="t", doc="")
        return args.exp

    via_set = exp_of("--set", "train.lr=2e-4", "--set", "rollout.k=4", "--set", "loss.kind=dapo", "--set=data.npr=off",
                     "--set", "data.n_train=none", "--set", "rollout.sglang_urls=http://a:1,http://b:2",
                     "--set", "data.chat_template=true", "--set", "model.n_layers=2")
    via_flags = exp_of("--train.lr", "2e-4", "--rollout.k", "4", "--loss.kind", "dapo", "--data.no-npr",
                       "--data.n-train", "None", "--rollout.sglang-urls", "http://a:1", "http://b:2",
                       "--data.chat-template", "--model.n_layers", "2")
    tiny = build_plan("tiny").exp
    assert via_set == via_flags != tiny
    assert (via_set.train.lr, via_set.rollout.k, via_set.loss.kind, via_set.data.npr) == (2e-4, 4, "dapo", False)
    assert via_set.rollout.sglang_urls == ("http://a:1", "http://b:2") and via_set.data.chat_template
    assert via_set.model.n_layers == 2 and via_set.model.d_model == tiny.model.d_model  # the rest: the preset's
    assert exp_of().train == tiny.train and exp_of().out_dir == "runs/tiny_s0"


def test_an_entry_point_builds_its_plans_from_the_presets_it_is_given():
    """``main(presets=...)`` (how ``experiments.scout_moe`` reuses math_8b's command line) takes each plan from its
    own table, not from the module's, so a table whose "tiny" differs is the one that runs."""
    import json

    own = {"tiny": lambda seed: dataclasses.replace(
        PRESETS["tiny"](seed), exp=dataclasses.replace(PRESETS["tiny"](seed).exp, name="own_tiny"))}
    code, out, _ = _run(lambda argv: math_8b.main(argv, presets=own), ["--preset", "tiny", "--print-config"])
    assert code == 0 and json.loads(out)["name"] == "own_tiny_scalerl"
    code, out, _ = _run(math_8b.main, ["--preset", "tiny", "--print-config"])
    assert code == 0 and json.loads(out)["name"] == "scalerl_tiny_scalerl"


def test_run_flags_reach_the_resolved_config():
    import json

    code, out, _ = _run(math_8b.main, ["--preset", "small", "--variant", "dapo", "--seed", "3", "--steps", "7",
                                       "--data", "d.jsonl", "--sglang-urls", "http://r:1", "--loss.eps-high", "0.3",
                                       "--print-config"])
    assert code == 0
    exp = config.from_dict(ExperimentConfig, json.loads(out))
    assert (exp.train.steps, exp.train.seed, exp.data.seed, exp.data.path, exp.data.source) == (7, 3, 3, "d.jsonl",
                                                                                                 "jsonl")
    assert (exp.rollout.engine, exp.rollout.sglang_urls, exp.rollout.local_servers) == ("sglang", ("http://r:1",), 0)
    assert (exp.loss.kind, exp.loss.eps_high, exp.out_dir) == ("dapo", 0.3, "runs/small_dapo_s3")
    code, out, _ = _run(loo.main, ["--preset", "tiny", "--seeds", "2", "--variants", "scalerl", "gspo", "--train.lr",
                                   "1e-4", "--print-config"])
    runs = json.loads(out)
    assert code == 0 and sorted(runs) == ["gspo_s0", "gspo_s1", "scalerl_s0", "scalerl_s1"]
    assert {r["train"]["lr"] for r in runs.values()} == {1e-4} and runs["gspo_s1"]["loss"]["kind"] == "gspo"
    assert runs["scalerl_s1"]["data"]["seed"] == 1  # parsed per seed: the flags land on each run's own defaults


# ---- every documented command still parses ----------------------------------------------------------------------

_CMD = re.compile(r"(?:python -m |-- )(experiments\.(?:math_8b|scout_moe|loo)|scalerl_jax\.(?:serve|fit))\b"
                  r"([^`#\n]*)")
_PLACEHOLDERS = {"N": "2", "P": "2", "I": "0", "S": "60", "X": "1.0", "C": "0.0", "FIELD=VALUE": "train.lr=2e-4"}


_SHELL_VAR = re.compile(r"\$\{?([A-Z_][A-Z0-9_]*)\}?")


def expand_script(text: str) -> str:
    """A launch script's text with its own variables filled in (``NAME=value`` and ``NAME="${NAME:-default}"``
    assignments, in order) and ``"$PYTHON" -m`` read as ``python -m``, so that its commands read as documented ones.
    A variable the script does not define, or sets to a command's output, becomes ``UNKNOWN``."""
    values: dict[str, str] = {}

    def sub(s: str) -> str:
        return _SHELL_VAR.sub(lambda m: values.get(m.group(1), "UNKNOWN"), s)

    for line in text.splitlines():
        if m := re.match(r"\s*([A-Z_][A-Z0-9_]*)=(\"[^\"]*\"|\S+)", line):
            raw = m.group(2).strip("\"'")
            default = re.fullmatch(r"\$\{\w+:-(.*)\}", raw)
            raw = default.group(1) if default else raw
            values[m.group(1)] = "UNKNOWN" if "$(" in raw else sub(raw).strip("\"'")  # a command's output: unknown here
    text = re.sub(r'"?\$\{?(?:PYTHON|SGLANG_PYTHON)\}?"? -m ', "python -m ", text)
    return sub(text)


def documented_sources() -> dict[str, str]:
    """Where commands are documented: README.md, BUILD.md, docs/*.md, examples/* (variables filled in)."""
    sources = {p: (ROOT / p).read_text() for p in ("README.md", "BUILD.md")}
    sources.update({str(p.relative_to(ROOT)): p.read_text() for p in sorted((ROOT / "docs").glob("*.md"))})
    sources.update({str(p.relative_to(ROOT)): expand_script(p.read_text())
                    for p in sorted((ROOT / "examples").iterdir()) if p.is_file()})
    return sources


def documented_commands() -> list[tuple[str, str, list[str]]]:
    """(where, module, argv) of every command line of ours in the docs, the example scripts and the entry points'
    docstrings, with line continuations joined and placeholders (``[--steps N]``, ``RUN_DIR [RUN_DIR ...]``,
    ``...``) filled in."""
    sources = documented_sources()
    sources.update({m: sys.modules[f.__module__].__doc__ for m, f in MAINS.items()})
    found = []
    for where, text in sources.items():
        for m in _CMD.finditer(re.sub(r"-- +", "-- ", re.sub(r"\\\n\s*", " ", text))):
            module, args = m.group(1), m.group(2)
            args = re.sub(r"\[[A-Z_]+ \.\.\.\]", "", args)  # [RUN_DIR ...], [URL ...]
            args = re.sub(r"\[(--[^\]]*)\]", r"\1", args).replace("...", " ")
            argv = shlex.split(args)
            if not argv:
                continue  # a module named in prose, not a command
            argv = [DEFAULT_PRESET.get(module, "tiny") if a == "P" and i and argv[i - 1] == "--preset"
                    else _PLACEHOLDERS.get(a, a) for i, a in enumerate(argv)]
            found.append((where, module, argv))
    return found


DOCUMENTED = documented_commands()


def test_the_documented_commands_cover_every_entry_point():
    assert {m for _, m, _ in DOCUMENTED} == set(MAINS)
    assert len(DOCUMENTED) >= 30


@pytest.mark.parametrize("where, module, argv", DOCUMENTED,
                         ids=[f"{w}:{m.split('.')[-1]} {' '.join(a)}"[:90] for w, m, a in DOCUMENTED])
def test_documented_command_parses(where, module, argv):
    wants_help = "--help" in argv
    code, out, err = _run(MAINS[module], argv if wants_help else [*argv, "--print-config"])
    assert code == 0, f"{where}: python -m {module} {' '.join(argv)} -> {code}: {err}"
    assert ("usage:" in out) if wants_help else out.lstrip().startswith("{")


def test_the_real_command_reports_a_bad_field_and_shows_help():
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "120"}
    bad = subprocess.run([sys.executable, "-m", "experiments.math_8b", "--preset", "tiny", "--train.steps", "many"],
                         capture_output=True, text=True, cwd=ROOT, env=env, timeout=HANG_S, check=False)
    assert bad.returncode == 2 and "--train.steps" in bad.stderr and "INT" in bad.stderr
