"""Fits of other trainers' logs: a CSV, TensorBoard event files (tensorboardX's writer) and a W&B run history (written
by wandb in offline mode) each give the same posterior as the same curve in a metrics.jsonl; bad input is an error
naming the file, line and column."""

import csv
import json
import warnings

import numpy as np
import pytest

from scalerl_jax import fit as fit_cli
from scalerl_jax.scaling import ScalingFitWarning
from scalerl_jax.scaling.report import fit_runs
from scalerl_jax.scaling.sources import load_csv, load_tensorboard, load_wandb_history, read_wandb_run

NUTS = {"num_samples": 100, "num_chains": 2, "seed": 3}
PER_STEP = 1 / 512  # GPU-hours per step: step 4 i -> compute i / 128, exact in float32 (TensorBoard's scalars)


def _curve(n=16):
    """A saturating eval curve whose numbers are exact in float32: compute i/128, reward (successes)/512 with 128
    prompts x 4 samples."""
    i = np.arange(n)
    c = i / 128
    mu = 0.3 + 0.5 / (1 + (0.04 / np.maximum(c, 1e-9)) ** 1.5)
    succ = np.random.default_rng(7).binomial(512, mu)
    return [{"step": 4 * int(k), "device_hours": float(c[k]), "val_reward": float(succ[k] / 512),
             "val_n": 128, "val_k": 4} for k in i]


EVALS = _curve()


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The same evals in a run directory's metrics.jsonl, fitted through fit_runs."""
    root = tmp_path_factory.mktemp("ref")
    (root / "ref").mkdir()
    with open(root / "ref" / "metrics.jsonl", "w") as f:
        for e in EVALS:
            f.write(json.dumps({"kind": "train", "step": e["step"], "loss": 0.1}) + "\n")
            f.write(json.dumps({"kind": "eval", **e}) + "\n")
    return fit_runs([root / "ref"], root / "out", make_plots=False, **NUTS)["runs"]["ref"]


def _cli(args, out) -> dict:
    argv = [*args, "--out", str(out), "--no-plots", "--num-samples", "100", "--num-chains", "2", "--seed", "3"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ScalingFitWarning)
        assert fit_cli.main(argv) == 0
    return json.loads((out / "summary.json").read_text())["runs"]


def _same_fit(entry: dict, ref: dict) -> None:
    assert entry["n_points"] == ref["n_points"] == len(EVALS)
    assert entry["bayes"]["likelihood"] == ref["bayes"]["likelihood"] == "counts"
    # the same float64 inputs (a CSV holds repr(), which round-trips exactly) and the same seed: the same work, bit
    # for bit (XLA on a CPU repeats a program's results exactly)
    for param, stats in ref["bayes"]["summary"].items():
        for stat, v in stats.items():
            assert entry["bayes"]["summary"][param][stat] == v, (param, stat)
    for k in ("mean", "lo", "hi", "grid"):
        assert entry["prediction"][k] == ref["prediction"][k], k


def test_csv_gives_the_metrics_jsonl_posterior(tmp_path, reference):
    with open(tmp_path / "other.csv", "w", newline="", encoding="utf-8-sig") as f:  # with a BOM, as spreadsheets
        w = csv.writer(f)
        w.writerow(["step", "gpu_hours", "acc", "prompts", "samples"])
        for e in EVALS:
            w.writerow([e["step"], repr(e["device_hours"]), repr(e["val_reward"]), 128, 4])
            w.writerow([e["step"] + 1, repr(e["device_hours"] + 1e-3), "", 128, 4])  # a train-only row: no reward
    with pytest.warns(ScalingFitWarning, match="skipped 16 rows"):
        curve = load_csv(tmp_path / "other.csv", "gpu_hours", "acc", n_col="prompts", k_col="samples")
    np.testing.assert_array_equal(curve.compute, [e["device_hours"] for e in EVALS])
    runs = _cli(["--csv", str(tmp_path / "other.csv"), "--compute-col", "gpu_hours", "--reward-col", "acc",
                 "--n-col", "prompts", "--k-col", "samples"], tmp_path / "out")
    _same_fit(runs["other"], reference)
    assert runs["other"]["compute_key"] == "gpu_hours" and runs["other"]["reward_key"] == "acc"
    # compute from a step column x cost per step, and a given name
    runs = _cli(["--csv", str(tmp_path / "other.csv"), "--compute-col", "step", "--compute-per-step", str(PER_STEP),
                 "--reward-col", "acc", "--n-col", "prompts", "--k-col", "samples", "--name", "steps"],
                tmp_path / "out2")
    _same_fit(runs["steps"], reference)


def _write_tensor_scalars(logdir, evals) -> None:
    """Event files as TF2's tf.summary.scalar writes them (a float tensor per value, plugin "scalars"), with
    tensorboard's own writer and protos."""
    from tensorboard.compat.proto import event_pb2, summary_pb2
    from tensorboard.summary.writer.event_file_writer import EventFileWriter
    from tensorboard.util import tensor_util

    meta = summary_pb2.SummaryMetadata(plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name="scalars"))
    w = EventFileWriter(str(logdir))
    for e in evals:
        values = [summary_pb2.Summary.Value(tag=f"eval/{k}", metadata=meta,
                                            tensor=tensor_util.make_tensor_proto(np.float32(e[k])))
                  for k in ("device_hours", "val_reward", "val_n", "val_k")]
        w.add_event(event_pb2.Event(step=e["step"], wall_time=1.0, summary=summary_pb2.Summary(value=values)))
    w.close()


def test_tensorboard_events_give_the_metrics_jsonl_posterior(tmp_path, reference):
    from tensorboardX import SummaryWriter

    tb = SummaryWriter(str(tmp_path / "tbrun" / "tensorboard"))
    for e in EVALS:
        tb.add_scalar("train/loss", 0.1, e["step"] + 1)
        for k in ("device_hours", "val_reward", "val_n", "val_k"):
            tb.add_scalar(f"eval/{k}", e[k], e["step"])
    tb.close()
    curve = load_tensorboard(tmp_path / "tbrun", "eval/device_hours", "eval/val_reward")  # finds tensorboard/
    assert curve.name == "tbrun" and curve.val_n is None
    np.testing.assert_array_equal(curve.compute, [e["device_hours"] for e in EVALS])
    np.testing.assert_array_equal(curve.reward, [e["val_reward"] for e in EVALS])
    # TF2's tf.summary.scalar (flax, CLU) writes one-element tensors instead of simple values: the same curve
    _write_tensor_scalars(tmp_path / "tf2", EVALS)
    curve = load_tensorboard(tmp_path / "tf2", "eval/device_hours", "eval/val_reward", n_tag="eval/val_n",
                             k_tag="eval/val_k")
    np.testing.assert_array_equal(curve.compute, [e["device_hours"] for e in EVALS])
    np.testing.assert_array_equal(curve.reward, [e["val_reward"] for e in EVALS])
    np.testing.assert_array_equal(curve.val_k, 4)
    runs = _cli(["--tensorboard", str(tmp_path / "tbrun" / "tensorboard"), "--compute-tag", "step",
                 "--compute-per-step", str(PER_STEP), "--reward-tag", "eval/val_reward", "--n-tag", "eval/val_n",
                 "--k-tag", "eval/val_k"], tmp_path / "out")
    _same_fit(runs["tbrun"], reference)


def test_wandb_offline_history_gives_the_metrics_jsonl_posterior(tmp_path, monkeypatch, reference):
    import wandb

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    run = wandb.init(project="sources-test", id="srcs0001", dir=str(tmp_path), reinit="create_new")
    for e in EVALS:
        run.log({f"eval/{k}": e[k] for k in ("device_hours", "val_reward", "val_n", "val_k")}, step=e["step"])
        run.log({"train/loss": 0.1}, step=e["step"] + 1)
    run.finish()
    wandb.teardown()  # finish returns before the service has written the whole log; this waits for it
    rows = read_wandb_run(tmp_path / "wandb")
    assert [r["_step"] for r in rows] == [s for e in EVALS for s in (e["step"], e["step"] + 1)]
    assert [r["eval/val_reward"] for r in rows[::2]] == [e["val_reward"] for e in EVALS]
    # a run killed mid-write: the log's tail is cut inside a record; the rows before it are read, with a warning
    log = next((tmp_path / "wandb").rglob("run-srcs0001.wandb"))
    data = log.read_bytes()
    (tmp_path / "cut.wandb").write_bytes(data[:len(data) // 2])
    with pytest.warns(ScalingFitWarning, match="truncated or damaged record"):
        head = read_wandb_run(tmp_path / "cut.wandb")
    assert 0 < len(head) < len(rows) and head == rows[:len(head)]
    runs = _cli(["--wandb-history", str(tmp_path / "wandb"), "--compute-col", "eval/device_hours", "--reward-col",
                 "eval/val_reward", "--n-col", "eval/val_n", "--k-col", "eval/val_k"], tmp_path / "out")
    _same_fit(runs["wandb"], reference)
    # the same history as run.history().to_json(orient="records") (missing keys null) and as JSON lines: same curve
    keys = sorted(set().union(*rows))
    (tmp_path / "h.json").write_text(json.dumps([{k: r.get(k) for k in keys} for r in rows]))
    (tmp_path / "h.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    for f in ("h.json", "h.jsonl"):
        c = load_wandb_history(tmp_path / f, "_step", "eval/val_reward", n_col="eval/val_n", k_col="eval/val_k",
                               compute_per_step=PER_STEP)
        np.testing.assert_array_equal(c.compute, [e["device_hours"] for e in EVALS])
        np.testing.assert_array_equal(c.reward, [e["val_reward"] for e in EVALS])
        np.testing.assert_array_equal(c.val_n, 128)


def test_bad_sources_exit_2_naming_file_line_and_column(tmp_path, capsys):
    f = tmp_path / "bad.csv"
    f.write_text("gpu_hours,acc\n0.0,0.3\n0.1,oops\n")
    assert fit_cli.main(["--csv", str(f), "--compute-col", "gpu_hours", "--reward-col", "reward", "--out",
                         str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "'reward'" in err and str(f) in err and "acc" in err  # the missing column, the file, what it has
    assert fit_cli.main(["--csv", str(f), "--compute-col", "gpu_hours", "--reward-col", "acc", "--out",
                         str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert f"{f}:3" in err and "'acc'" in err and "'oops'" in err
    j = tmp_path / "h.json"
    j.write_text(json.dumps([{"_step": 1, "acc": 0.5}]))
    with pytest.raises(ValueError, match="no history row has column 'eval/acc'"):
        load_wandb_history(j, "_step", "eval/acc")
    jl = tmp_path / "h.jsonl"
    jl.write_text('{"_step": 1, "acc": 0.5}\n\n{"_step": 2, "acc": "high"}\n{"_step": 3, "ac')  # cut mid-line
    with pytest.raises(ValueError, match=r"h.jsonl: line 3: column 'acc' holds 'high', not a number"):
        with pytest.warns(ScalingFitWarning, match="skipped 1 unparseable lines"):
            load_wandb_history(jl, "_step", "acc")
    with pytest.raises(SystemExit) as e:  # a source without its column flags
        fit_cli.main(["--csv", str(f), "--out", str(tmp_path / "o")])
    assert e.value.code == 2 and "--compute-col" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        fit_cli.main(["--out", str(tmp_path / "o")])
    assert "give at least one RUN_DIR" in capsys.readouterr().err
