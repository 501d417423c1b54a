"""The documentation a user reads stays true to the code.

- docs/METRICS.md documents every key of every metrics row: the row literals in the code (read statically), the
  policy loss's metrics (computed on a small batch), every row of the shared smoke run's metrics.jsonl and of a short
  MoE run (the MoE smoke run's with --heavy).
- Every command of the other entry points (``scalerl_jax.aot``, ``.launch``, ``.data.prepare``, ``.rewards.code``,
  ``benchmarks.*``) in README.md, BUILD.md, docs/*.md and examples/ parses with that entry point's own parser (the
  experiment, fit and serve commands are tests/test_cli.py's).
- README.md, BUILD.md, docs/ and examples/ hold no work history (numbered stops, sessions or rounds of past work,
  issue notes, temporary run directories), nor do the code's comments and docstrings.
- Relative links in the docs point at files that exist; LICENSE and CITATION.cff exist and parse.
"""

from __future__ import annotations

import ast
import io
import json
import re
import shlex
import subprocess
import sys
import tokenize
from pathlib import Path

import numpy as np
import pytest
import yaml

from tests.conftest import HANG_S
from tests.test_cli import _PLACEHOLDERS, documented_sources

ROOT = Path(__file__).resolve().parents[1]
METRICS_MD = ROOT / "docs" / "METRICS.md"
# the rows that carry the compute columns, and the kinds whose rows may also carry a train row's keys (METRICS.md:
# an error row carries the batch keys of the train row it replaces; the summary row the fleet keys)
COMPUTE_KINDS = ("train", "eval", "error", "summary")
WITH_TRAIN_KEYS = ("error", "summary")


# ---- docs/METRICS.md ---------------------------------------------------------------------------------------------


def metrics_doc() -> dict[str, list[str]]:
    """kind -> the keys METRICS.md's table for that kind names (``"compute"``: the shared compute columns). A key
    written ``name_<x>`` stands for a family."""
    doc: dict[str, list[str]] = {}
    kind = None
    for line in METRICS_MD.read_text().splitlines():
        if line.startswith("## "):
            m = re.search(r'"kind": "(\w+)"', line)
            kind = m.group(1) if m else "compute" if "Compute columns" in line else (
                "warmstart" if "warmstart.jsonl" in line else None)
            if kind:
                doc.setdefault(kind, [])
        elif kind and line.startswith("| `"):
            first_cell = line.split("|")[1]
            doc[kind] += re.findall(r"`([^`]+)`", first_cell)
    return doc


def _pattern(key: str) -> re.Pattern:
    return re.compile("".join(".+" if part.startswith("<") else re.escape(part)
                              for part in re.split(r"(<[^>]+>)", key)) + r"\Z")


def allowed_keys(kind: str, doc: dict[str, list[str]]) -> list[re.Pattern]:
    keys = [*doc.get(kind, []), "kind", "step"]  # METRICS.md: every row has a kind and (but summary) its step
    if kind in COMPUTE_KINDS:
        keys += doc["compute"]
    if kind in WITH_TRAIN_KEYS:
        keys += doc["train"]
    return [_pattern(k) for k in keys]


def undocumented(rows: list[dict], doc: dict[str, list[str]]) -> set[tuple[str, str]]:
    """(kind, key) pairs of ``rows`` that METRICS.md does not document."""
    missing = set()
    for row in rows:
        kind = row.get("kind", "?")
        if kind not in doc:
            missing.add((kind, "<the whole row kind>"))
            continue
        pats = allowed_keys(kind, doc)
        missing |= {(kind, k) for k in row if not any(p.match(k) for p in pats)}
    return missing


def test_the_metrics_doc_reader_sees_every_section():
    doc = metrics_doc()
    assert {"compute", "eval", "train", "error", "data", "length_check", "summary", "warmstart"} <= set(doc)
    assert "val_reward" in doc["eval"] and "logp_diff_abs_mean" in doc["train"] and "device_hours" in doc["compute"]
    assert "is_ratio_min" in doc["train"]  # two keys in one cell
    # the check itself: a family matches its members only, and an unknown key or kind is reported
    assert not undocumented([{"kind": "train", "step": 1, "pass_rate_code": 0.5, "router_load_e12": 0.1}], doc)
    assert undocumented([{"kind": "train", "pass_rate": 1, "no_such_key": 0}], doc) == {("train", "no_such_key")}
    assert undocumented([{"kind": "eval", "val_reward_": 0.1}], doc) == {("eval", "val_reward_")}
    assert undocumented([{"kind": "nope"}], doc) == {("nope", "<the whole row kind>")}


def _row_literals() -> list[dict]:
    """Every dict literal in scalerl_jax/ and experiments/ with a constant ``"kind"``, as {key: None} of its constant
    string keys (keys computed at run time are the smoke runs' test's)."""
    rows = []
    for path in sorted([*(ROOT / "scalerl_jax").rglob("*.py"), *(ROOT / "experiments").rglob("*.py")]):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if not isinstance(node, ast.Dict):
                continue
            keys = {k.value: v for k, v in zip(node.keys, node.values, strict=True)
                    if isinstance(k, ast.Constant) and isinstance(k.value, str)}
            kind = keys.get("kind")
            if isinstance(kind, ast.Constant) and isinstance(kind.value, str):
                rows.append({"kind": kind.value, **dict.fromkeys(k for k in keys if k != "kind")})
    return rows


def test_metrics_doc_covers_every_row_the_code_writes_literally():
    rows = _row_literals()
    kinds = {r["kind"] for r in rows}
    assert {"eval", "train", "error", "summary", "data", "length_check", "warmstart"} <= kinds, kinds
    assert not undocumented(rows, metrics_doc())


@pytest.mark.parametrize("kind", ["cispo", "gspo", "dapo", "grpo"])
def test_metrics_doc_covers_the_policy_loss_metrics(kind):
    from scalerl_jax.config import LossConfig
    from scalerl_jax.losses import policy_loss

    rng = np.random.default_rng(0)
    logp = np.log(rng.uniform(0.1, 0.9, (4, 6))).astype(np.float32)
    gen = (logp + rng.normal(0, 0.1, (4, 6))).astype(np.float32)
    mask = np.ones((4, 6), np.float32)
    _, metrics = policy_loss(logp, gen, np.array([1.0, -1.0, 0.5, -0.5], np.float32), mask,
                             np.array([0, 0, 1, 1], np.int32), LossConfig(kind=kind))
    assert metrics and not undocumented([{"kind": "train", **metrics}], metrics_doc())


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _moe_rows(out: Path) -> list[dict]:
    """The rows of a 2-step RL run of the MoE preset's recipe (the tiny Llama-4 MoE, shrunk; no warm start): the
    MoE's own keys (router statistics, the aux loss) as the trainer writes them."""
    import dataclasses

    import jax
    from scalerl_jax.experiments.presets import build_plan
    from scalerl_jax.experiments.run_path import build_trainer

    from scalerl_jax.data.pipeline import build_prompt_data
    from scalerl_jax.data.tokenizer import CharTokenizer
    from scalerl_jax.models import init_params

    R = dataclasses.replace
    plan = build_plan("tiny_moe", "scalerl")
    model = R(plan.exp.model, d_model=32, n_heads=2, n_kv_heads=1, head_dim=16, ffn_dim=64, expert_ffn_dim=32)
    exp = R(plan.exp, model=model, out_dir=str(out), rollout=R(plan.exp.rollout, prompts_per_batch=4, group_size=4,
                                                                k=2),
            train=R(plan.exp.train, steps=2, eval_every=1, eval_samples=1, checkpoint_every=100))

    def score(completions, problems):  # +1 iff the completion's length is even: every group has variance
        return np.array([1.0 if len(c) % 2 == 0 else -1.0 for c in completions], np.float32), {"timeouts": 0}

    trainer = build_trainer(R(plan, exp=exp), init_params(model, jax.random.key(0), std=0.5),
                            build_prompt_data("arith", val_size=8, seed=0), tok=CharTokenizer(), score=score,
                            log=lambda s: None)
    try:
        trainer.run()
    finally:
        trainer.close()
    return _rows(out / "metrics.jsonl")


@pytest.mark.slow
@pytest.mark.lane  # a short MoE run of its own: in the background lane, after the smoke run
def test_metrics_doc_covers_every_row_of_the_smoke_run_and_of_a_moe_run(smoke_run, tmp_path):
    rows = _rows(smoke_run / "metrics.jsonl") + _moe_rows(tmp_path / "moe")
    warm = _rows(smoke_run / "warmstart.jsonl")
    assert {"train", "eval", "data", "summary", "forecast"} <= {r["kind"] for r in rows} and warm
    assert any(k.startswith("router_load_e") for r in rows for k in r)  # the MoE run's keys are in
    missing = undocumented(rows + warm, metrics_doc())
    assert not missing, f"docs/METRICS.md lacks these (kind, key) pairs: {sorted(missing)}"


@pytest.mark.heavy
def test_metrics_doc_covers_every_row_of_the_moe_smoke_run(smoke_moe_run):
    rows = _rows(smoke_moe_run / "metrics.jsonl")
    assert any(k.startswith("router_load_e") for r in rows for k in r)
    missing = undocumented(rows, metrics_doc())
    assert not missing, f"docs/METRICS.md lacks these (kind, key) pairs: {sorted(missing)}"


# ---- the other entry points' documented commands ----------------------------------------------------------------

_ARGPARSE_CMD = re.compile(r"python -m (scalerl_jax\.(?:aot|launch|data\.prepare|rewards\.code)|benchmarks\.\w+)\b"
                           r"([^`#\n]*)")
_CHOICES = re.compile(r"\{(\w+),[\w,]+\}")  # {gsm8k,math,polaris,deepcoder} -> gsm8k

# Run in a fresh interpreter (the modules set XLA flags at import): each entry point's main() with its parser's
# parse_args stopped right after parsing, so nothing runs. Prints one JSON list of [status, error text].
_PARSE_ONLY = r"""
import argparse, contextlib, importlib, inspect, io, json, sys

class Parsed(Exception):
    pass

real = argparse.ArgumentParser.parse_args
def parse_only(self, *a, **kw):
    real(self, *a, **kw)
    raise Parsed

argparse.ArgumentParser.parse_args = parse_only
out = []
for module, argv in json.loads(sys.stdin.read()):
    err = io.StringIO()
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
            main = importlib.import_module(module).main
            sys.argv = [module, *argv]
            main(argv) if inspect.signature(main).parameters else main()
        out.append([1, "main() ran past its parser"])
    except Parsed:
        out.append([0, ""])
    except SystemExit as e:
        out.append([e.code if isinstance(e.code, int) else 1, err.getvalue()[-800:]])
    except Exception as e:
        out.append([1, repr(e)])
print(json.dumps(out))
"""


def other_documented_commands() -> list[tuple[str, str, list[str]]]:
    found = []
    for where, text in documented_sources().items():
        for m in _ARGPARSE_CMD.finditer(re.sub(r"\\\n\s*", " ", text)):
            args = _CHOICES.sub(r"\1", m.group(2))
            args = re.sub(r"\[(--[^\]]*)\]", r"\1", args).split(" -- ")[0]  # launch: the command after -- is test_cli's
            argv = [_PLACEHOLDERS.get(a, a) for a in shlex.split(args)]
            if argv:  # else a module named in prose, not a command
                found.append((where, m.group(1), argv))
    return found


def test_every_documented_command_of_the_other_entry_points_parses():
    cmds = other_documented_commands()
    modules = {m for _, m, _ in cmds}
    assert {"scalerl_jax.aot", "scalerl_jax.launch", "scalerl_jax.data.prepare", "scalerl_jax.rewards.code"} <= modules
    assert any(m.startswith("benchmarks.") for m in modules)
    r = subprocess.run([sys.executable, "-c", _PARSE_ONLY], input=json.dumps([[m, a] for _, m, a in cmds]),
                       capture_output=True, text=True, cwd=ROOT, timeout=HANG_S, check=False)
    assert r.returncode == 0, r.stderr[-3000:]
    results = json.loads(r.stdout.strip().splitlines()[-1])
    bad = [f"{w}: python -m {m} {' '.join(a)} -> {code}: {err}" for (w, m, a), (code, err) in zip(cmds, results,
                                                                                                     strict=True)
           if code != 0]
    assert not bad, "\n".join(bad)


def test_a_bad_documented_command_is_caught():
    r = subprocess.run([sys.executable, "-c", _PARSE_ONLY],
                       input=json.dumps([["scalerl_jax.data.prepare", ["nosuchkind", "in", "out"]],
                                         ["scalerl_jax.data.prepare", ["gsm8k", "in", "out"]]]),
                       capture_output=True, text=True, cwd=ROOT, timeout=HANG_S, check=False)
    (code_bad, err), (code_ok, _) = json.loads(r.stdout.strip().splitlines()[-1])
    assert code_bad == 2 and "nosuchkind" in err and code_ok == 0


# ---- no work history -----------------------------------------------------------------------------------------------

# a numbered stop / session / round of past work, issue notes or numbers, temporary run directories, the wording of a
# brief to implementers
HISTORY = re.compile(r"\bstop\s*#?\d+|\bstop\d+|\bsession\s*#?\d+|\bround\s*#?\d+\b|issue notes?\b|\bissue\s*#\d+"
                     r"|\(#\d+\)|#\d+ is blocked|the issue's|/tmp/|this session|throwaway prototype|absorb, don't copy",
                     re.IGNORECASE)
# in code, "round 1 / round 2" are the two request rounds of the SGLang client and /tmp/ paths are real defaults and
# test probes: comments and docstrings are held to the narrower patterns
CODE_HISTORY = re.compile(r"\bstop\s*#?\d+|\bstop\d+|\bsession\s*#?\d+|issue notes?\b|\bissue\s*#\d+|\(#\d+\)"
                          r"|the issue's|--out /tmp/|/tmp/\w*run\b|throwaway prototype", re.IGNORECASE)


def _doc_files() -> list[Path]:
    files = [ROOT / "README.md", ROOT / "BUILD.md", ROOT / "data" / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    return files + sorted(p for p in (ROOT / "examples").iterdir() if p.is_file())


def test_the_docs_hold_no_work_history():
    hits = [f"{p.relative_to(ROOT)}:{n}: {line.strip()}" for p in _doc_files()
            for n, line in enumerate(p.read_text().splitlines(), 1) if HISTORY.search(line)]
    assert not hits, "\n".join(hits)


def _comments_and_docstrings(path: Path) -> list[tuple[int, str]]:
    """(line, text) of every comment and every string that stands alone as a statement (docstrings)."""
    src = path.read_text()
    out = [(t.start[0], t.string) for t in tokenize.generate_tokens(io.StringIO(src).readline)
           if t.type == tokenize.COMMENT]
    out += [(n.lineno, n.value.value) for n in ast.walk(ast.parse(src)) if isinstance(n, ast.Expr)
            and isinstance(n.value, ast.Constant) and isinstance(n.value.value, str)]
    return out


def test_the_code_comments_and_docstrings_hold_no_work_history():
    dirs = ("scalerl_jax", "experiments", "benchmarks", "kernels", "tests")
    hits = []
    for path in sorted(p for d in dirs for p in (ROOT / d).rglob("*.py") if p != Path(__file__).resolve()):
        for n, text in _comments_and_docstrings(path):
            hits += [f"{path.relative_to(ROOT)}:{n}: {m.group(0)!r}" for m in CODE_HISTORY.finditer(text)]
    for path in sorted([*(ROOT / "scripts").glob("*.sh"), *(ROOT / "benchmarks").glob("*.sh")]):
        lines = path.read_text().splitlines()
        hits += [f"{path.relative_to(ROOT)}:{n}: {line.strip()}" for n, line in enumerate(lines, 1)
                 if "#" in line and CODE_HISTORY.search(line[line.index("#"):])]
    assert not hits, "\n".join(hits)


def test_the_work_history_patterns_catch_what_they_should():
    for text in ("in stop 26's study", "see the issue notes", "--out /tmp/h4run", "session 12", "(#18)"):
        assert CODE_HISTORY.search(text) and HISTORY.search(text), text
    assert HISTORY.search("measured in round 3") and not CODE_HISTORY.search("Round 2 continues every sample")
    for text in ("stops at the first error", "the pytest session's fixtures", "rounds of PPO-off-policy-k"):
        assert not HISTORY.search(text) and not CODE_HISTORY.search(text), text


# ---- links, licence, citation, length ----------------------------------------------------------------------------


def test_relative_links_in_the_docs_resolve():
    broken = []
    for p in _doc_files():
        if p.suffix != ".md":
            continue
        for target in re.findall(r"\]\(([^)\s#]+)(?:#[^)]*)?\)", p.read_text()):
            if not re.match(r"[a-z]+://", target) and not (p.parent / target).exists():
                broken.append(f"{p.relative_to(ROOT)} -> {target}")
    assert not broken, broken


def test_license_and_citation():
    assert "Apache License" in (ROOT / "LICENSE").read_text() and "Version 2.0" in (ROOT / "LICENSE").read_text()
    cff = yaml.safe_load((ROOT / "CITATION.cff").read_text())
    assert cff["cff-version"] == "1.2.0" and cff["license"] == "Apache-2.0" and cff["title"] and cff["authors"]
    paper = cff["preferred-citation"]
    assert paper["title"] == "The Art of Scaling Reinforcement Learning Compute for LLMs"
    assert "2510.13786" in paper["url"] and paper["year"] == 2025
    assert "Apache-2.0" in (ROOT / "README.md").read_text() and "licence" in (ROOT / "data" / "README.md").read_text()


def test_the_readme_stays_a_readme():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 220, f"README.md has {len(lines)} lines; move detail into docs/"
    for link in ("docs/GPU.md", "docs/DATA.md", "docs/METRICS.md", "docs/FITTING.md", "docs/results/README.md"):
        assert link in "\n".join(lines), link
