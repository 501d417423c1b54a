"""MetricsWriter's W&B output: rows reach the W&B run (offline without credentials) under TensorBoard's names and
steps, a resumed run continues the same W&B run without re-logging steps, and without a project wandb is never
imported."""

import json
import subprocess
import sys

import pytest

from scalerl_jax.metrics import MetricsWriter, read_metrics, wandb_credentials
from scalerl_jax.scaling.sources import read_wandb_run
from tests.conftest import HANG_S


@pytest.fixture
def no_credentials(tmp_path, monkeypatch):
    for var in ("WANDB_API_KEY", "WANDB_MODE", "WANDB_BASE_URL", "WANDB_DIR"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("NETRC", str(tmp_path / "home" / "no-netrc"))
    monkeypatch.setenv("WANDB_SILENT", "true")


def _history(run_dir) -> dict[int, dict]:
    """{step: the logged scalars} of the W&B run under run_dir, W&B's own fields (_step, _runtime, ...) left out."""
    out = {}
    for r in read_wandb_run(run_dir / "wandb"):
        out.setdefault(r["_step"], {}).update({k: v for k, v in r.items() if not k.startswith("_")})
    return out


def test_rows_reach_the_offline_wandb_run_and_a_resume_skips_logged_steps(tmp_path, no_credentials, capsys):
    run = tmp_path / "run"
    w = MetricsWriter(run, wandb_project="scalerl-test", wandb_config={"lr": 1e-4}, run_name="t")
    err = capsys.readouterr().err
    assert "logging offline to" in err and "wandb sync " + str(run / "wandb") in err
    w.write({"kind": "data", "n_train": 100})  # no step: metrics.jsonl only
    w.write({"kind": "train", "step": 1, "loss": 0.5, "clipped": False, "note": "text"})
    w.write({"kind": "train", "step": 2, "loss": 0.25})
    w.write({"kind": "eval", "step": 2, "val_reward": 0.375, "device_hours": 0.125, "val_n": 128})
    offset = w.offset()  # a checkpoint at step 2
    w.write({"kind": "train", "step": 3, "loss": 0.125})
    w.write({"kind": "forecast", "step": 3, "A_mean": 0.8, "A_lo": 0.7})
    w.close()
    first_id = json.loads((run / "wandb.json").read_text())["id"]
    assert _history(run) == {1: {"train/loss": 0.5}, 2: {"train/loss": 0.25, "eval/val_reward": 0.375,
                                                         "eval/device_hours": 0.125, "eval/val_n": 128},
                             3: {"train/loss": 0.125, "forecast/A_mean": 0.8, "forecast/A_lo": 0.7}}

    # resumed from the step-2 checkpoint: step 3 is trained again; W&B keeps its first step 3, gets step 4
    w = MetricsWriter(run, resume_offset=offset, wandb_project="scalerl-test")
    w.write({"kind": "train", "step": 3, "loss": 9.0})
    w.write({"kind": "train", "step": 4, "loss": 0.0625})
    w.close()
    assert json.loads((run / "wandb.json").read_text())["id"] == first_id
    logs = sorted(p.name for p in (run / "wandb").rglob("run-*.wandb"))
    assert logs == [f"run-{first_id}.wandb"] * 2  # one offline directory per start, one run id
    hist = _history(run)
    assert sorted(hist) == [1, 2, 3, 4] and hist[3]["train/loss"] == 0.125 and hist[4] == {"train/loss": 0.0625}
    assert [r["loss"] for r in read_metrics(run, "train")] == [0.5, 0.25, 9.0, 0.0625]  # metrics.jsonl: the re-run

    # a fresh run in the same directory is a new W&B run
    MetricsWriter(run, wandb_project="scalerl-test").close()
    assert json.loads((run / "wandb.json").read_text())["id"] != first_id


def test_wandb_credentials(tmp_path, no_credentials, monkeypatch):
    assert not wandb_credentials()
    netrc = tmp_path / "home" / "netrc"
    netrc.parent.mkdir(parents=True, exist_ok=True)
    netrc.write_text("machine api.wandb.ai\n  login user\n  password abc\n")
    netrc.chmod(0o600)
    monkeypatch.setenv("NETRC", str(netrc))
    assert wandb_credentials()
    monkeypatch.setenv("WANDB_BASE_URL", "https://wandb.example.org:8443")  # another host: no entry for it
    assert not wandb_credentials()
    monkeypatch.setenv("WANDB_API_KEY", "k" * 40)
    assert wandb_credentials()


def test_without_a_project_wandb_is_never_imported(tmp_path):
    code = ("import sys; from scalerl_jax.metrics import MetricsWriter\n"
            f"w = MetricsWriter({str(tmp_path / 'run')!r}); w.write({{'kind': 'train', 'step': 1, 'loss': 1.0}})\n"
            "w.close(); assert 'wandb' not in sys.modules, 'wandb was imported'")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=HANG_S)
    assert r.returncode == 0, r.stderr


def test_a_missing_wandb_is_a_clear_error_only_when_asked_for(tmp_path, no_credentials, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # `import wandb` now fails as when it is not installed
    w = MetricsWriter(tmp_path / "run")
    w.write({"kind": "train", "step": 1, "loss": 1.0})
    w.close()
    (tmp_path / "run" / "metrics.jsonl").write_text('{"kind": "train", "step": 1}\n')
    with pytest.raises(RuntimeError, match=r"project 'p'.*pip install wandb"):
        MetricsWriter(tmp_path / "run", wandb_project="p")
    assert (tmp_path / "run" / "metrics.jsonl").read_text() == '{"kind": "train", "step": 1}\n'  # nothing lost
