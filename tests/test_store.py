"""experiments/store.py and its use by experiments.loo: a study continued from a store of finished runs (written by
hand here) runs only what the store lacks, never reuses a stored run of another config, and its comparison is
rebuilt from the stored files."""

import dataclasses
import json
import subprocess

import numpy as np
import pytest
from scalerl_jax.experiments import loo, presets, store
from scalerl_jax.experiments.presets import build_plan

R = dataclasses.replace


def _plan(seed: int = 0):
    """The smoke preset, as the study plans it (the fake run below never trains it)."""
    return presets.smoke_plan(seed)


def _write_run(run_dir, plan, A, n=12, seed=0):
    """A finished run as a run writes it: config.json (the plan's config), eval rows on the sigmoid law
    R(C) = R0 + (A - R0) / (1 + (C_mid / C)^B) worked by hand (B = 1.5, C_mid = 0.02, R0 = 0.3), summary.json."""
    rng = np.random.default_rng(seed)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.json").write_text(json.dumps(dataclasses.asdict(plan.exp), default=str))
    with open(run_dir / "metrics.jsonl", "w") as f:
        for i, c in enumerate(np.linspace(0.0, 0.1, n)):
            r = 0.3 if c == 0 else 0.3 + (A - 0.3) / (1 + (0.02 / c) ** 1.5)
            f.write(json.dumps({"kind": "eval", "step": i, "flops": float(c), "device_hours": float(c),
                                "val_reward": float(r + 0.005 * rng.standard_normal())}) + "\n")
    (run_dir / "summary.json").write_text(json.dumps({"run": {"steps": n - 1}}))


@pytest.fixture
def fake_runs(monkeypatch):
    """experiments.loo with run_experiment replaced by one that writes a finished run (A = 0.6) and records it."""
    ran = []
    monkeypatch.setitem(presets.PRESETS, "fakepreset", _plan)

    def run_experiment(plan, **kw):
        ran.append(plan.exp.out_dir)
        from pathlib import Path

        _write_run(Path(plan.exp.out_dir), plan, A=0.6)

    monkeypatch.setattr(loo, "run_experiment", run_experiment)
    return ran


def test_store_run_copies_only_the_small_files_and_marks_them(tmp_path):
    run = tmp_path / "out" / "scalerl_s0"
    _write_run(run, _plan(), A=0.7)
    (run / "checkpoints" / "8").mkdir(parents=True)
    (run / "checkpoints" / "8" / "state.bin").write_bytes(b"x" * 100)
    (run / "fit").mkdir()
    (run / "fit" / "fit.png").write_bytes(b"png")
    (run / "fit" / "posterior.nc").write_bytes(b"big")
    (run / "report.md").write_text("# report\n")
    kept = store.store_run(run, tmp_path / "store")
    files = sorted(p.relative_to(kept).as_posix() for p in kept.rglob("*") if p.is_file())
    assert files == ["config.json", "fit/fit.png", "metrics.jsonl", "report.md", "stored.json", "summary.json"]
    assert json.loads((kept / "stored.json").read_text())["from"] == str(run.resolve())
    assert store.stored_run(tmp_path / "store", "scalerl_s0") == kept
    assert not list((tmp_path / "store").glob(".*partial"))


def test_an_unfinished_run_is_not_stored_and_a_half_copy_is_not_a_stored_run(tmp_path):
    run = tmp_path / "scalerl_s0"
    _write_run(run, _plan(), A=0.7)
    (run / "summary.json").unlink()  # killed before its end
    with pytest.raises(ValueError, match="not a finished run"):
        store.store_run(run, tmp_path / "store")
    half = tmp_path / "store" / "scalerl_s0"
    _write_run(half, _plan(), A=0.7)  # the files, but no stored.json: a copy that did not complete
    assert store.stored_run(tmp_path / "store", "scalerl_s0") is None


@pytest.mark.extended  # three fits and their plots, twice: a study, as the leave-one-out studies are
def test_a_study_runs_only_what_the_store_lacks_and_compares_the_stored_runs(tmp_path, fake_runs, capsys):
    kept = tmp_path / "results" / "study"
    for variant, a in (("scalerl", 0.8), ("dapo", 0.5)):
        name = f"{variant}_s0"
        _write_run(tmp_path / "elsewhere" / name, build_plan("fakepreset", variant, seed=0), A=a)
        store.store_run(tmp_path / "elsewhere" / name, kept)
    out = tmp_path / "runs" / "study"
    study = ["--preset", "fakepreset", "--variants", "scalerl", "dapo", "gspo", "--store", str(kept),
             "--compute-key", "flops"]
    assert loo.main([*study, "--out", str(out)]) == 0
    said = capsys.readouterr().out
    assert fake_runs == [str(out / "gspo_s0")]  # the one run the store did not have
    assert said.count("finished in the results store with the same config") == 2
    assert store.stored_run(kept, "gspo_s0") is not None  # stored as it finished
    table = (out / "comparison" / "comparison.md").read_text()
    rows = {r.split("|")[1].strip(): r.split("|") for r in table.splitlines() if r.startswith("| ") and "_s0" in r}
    assert set(rows) == {"scalerl_s0", "dapo_s0", "gspo_s0"}
    # the stored curves were fitted: the ceilings written by hand come back (and the fake run's 0.6)
    for name, a in (("scalerl_s0", 0.8), ("dapo_s0", 0.5), ("gspo_s0", 0.6)):
        # "mean [lo, hi]": the truth within the 90 % interval's width (3.3 posterior sd) of the mean
        mean, lo, hi = (float(x) for x in rows[name][4].replace("[", " ").replace("]", " ").replace(",", " ").split())
        assert abs(mean - a) <= hi - lo, (name, rows[name][4])
    assert (kept / "comparison" / "comparison.md").read_text() == table
    # a clone on another machine: no run directories at all, the store alone rebuilds the comparison
    fresh = tmp_path / "runs" / "clone"
    assert loo.main([*study, "--out", str(fresh)]) == 0
    assert fake_runs == [str(out / "gspo_s0")]
    assert (fresh / "comparison" / "comparison.md").read_text() == table


def test_a_stored_run_of_another_config_is_run_again_and_kept_aside(tmp_path, fake_runs, capsys):
    kept = tmp_path / "store"
    plan = build_plan("fakepreset", "scalerl", seed=0)
    other = R(plan, exp=R(plan.exp, train=R(plan.exp.train, lr=1e-4)))
    _write_run(tmp_path / "old" / "scalerl_s0", other, A=0.8)
    store.store_run(tmp_path / "old" / "scalerl_s0", kept)
    out = tmp_path / "runs"
    assert loo.main(["--preset", "fakepreset", "--variants", "scalerl", "--out", str(out), "--store", str(kept),
                     "--compute-key", "flops"]) == 0
    said = capsys.readouterr().out
    assert f"train.lr: ran 0.0001, planned {plan.exp.train.lr:g}" in said and fake_runs == [str(out / "scalerl_s0")]
    assert json.loads((kept / "scalerl_s0" / "config.json").read_text())["train"]["lr"] == plan.exp.train.lr
    aside = kept / "superseded" / "scalerl_s0.1"
    assert json.loads((aside / "config.json").read_text())["train"]["lr"] == 1e-4  # nothing lost


def test_default_store_is_results_named_after_the_study(tmp_path):
    assert store.default_store(tmp_path / "runs" / "loo_tiny", root=tmp_path) == tmp_path / "results" / "loo_tiny"


def test_commit_run_commits_only_the_stored_folder(tmp_path, monkeypatch):
    repo = tmp_path / "repo"
    repo.mkdir()
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.com"]
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    subprocess.run([*git, "commit", "-q", "--allow-empty", "-m", "start"], cwd=repo, check=True)
    (repo / "unrelated.txt").write_text("not part of the run\n")
    subprocess.run(["git", "add", "unrelated.txt"], cwd=repo, check=True)
    _write_run(tmp_path / "scalerl_s0", _plan(), A=0.7)
    kept = store.store_run(tmp_path / "scalerl_s0", repo / "results" / "study")
    for k in ("GIT_AUTHOR_NAME", "GIT_COMMITTER_NAME"):
        monkeypatch.setenv(k, "t")
    for k in ("GIT_AUTHOR_EMAIL", "GIT_COMMITTER_EMAIL"):
        monkeypatch.setenv(k, "t@example.com")
    assert store.commit_run(kept, log=print) is True
    assert store.commit_run(kept, log=print) is False  # nothing new
    files = subprocess.run(["git", "show", "--name-only", "--format=", "HEAD"], cwd=repo, capture_output=True,
                           text=True, check=True).stdout.split()
    assert sorted(files) == sorted(f"results/study/scalerl_s0/{n}" for n in
                                   ("config.json", "metrics.jsonl", "stored.json", "summary.json"))
    staged = subprocess.run(["git", "diff", "--cached", "--name-only"], cwd=repo, capture_output=True, text=True,
                            check=True).stdout.split()
    assert staged == ["unrelated.txt"]  # the user's own staged work is left as it was


@pytest.mark.parametrize(("section", "field", "then", "now"), [
    ("train", "row_buckets", 1, 8),  # before it existed every step ran on the full batch (FLOPs counted otherwise)
    ("data", "arith_b_max", 99, 9),  # before it existed the arithmetic was every a+b*c with b <= 99
])
def test_a_stored_config_from_before_a_field_existed_ran_its_old_behaviour(section, field, then, now):
    """A config.json written before a field existed is the run planned with the value that reproduces what ran then,
    not the one planned with today's preset value."""
    plan = build_plan("smoke", "scalerl", seed=0)
    written = json.loads(json.dumps(dataclasses.asdict(plan.exp), default=str))
    del written[section][field]
    assert getattr(getattr(plan.exp, section), field) == now
    assert store.config_differences(plan, written) == [f"{section}.{field}: ran {then}, planned {now}"]
    old = R(plan, exp=R(plan.exp, **{section: R(getattr(plan.exp, section), **{field: then})}))
    assert store.config_differences(old, written) == []
