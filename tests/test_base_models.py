"""experiments/base_models.py's warm-start cache: a warm start a run made is reused by a later run with the same
settings (byte for byte), never by one with other settings or other code, and not at all when the cache is off."""

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest
from scalerl_jax.experiments import presets
from scalerl_jax.experiments.base_models import (
    WARM_CODE,
    cache_name,
    cached_warm_start,
    prepare_base,
    warm_cache_dir,
    warm_start_key,
)

from scalerl_jax.config import ModelConfig
from tests.conftest import ROOT

R = dataclasses.replace


def _plan(seed: int = 0, **warm):
    """The smoke preset on a 1-layer model with a 10-step warm start: seconds, not minutes."""
    p = presets.smoke_plan(seed)
    model = R(p.exp.model, d_model=32, n_layers=1, n_heads=2, n_kv_heads=1, head_dim=16, ffn_dim=64)
    return R(p, exp=R(p.exp, model=model, data=R(p.exp.data, val_size=16)),
             **{"warm_steps": 10, "warm_batch": 8, "warm_warmup": 2, **warm})


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SCALERL_WARMSTART_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_a_later_run_with_the_same_settings_copies_the_warm_start(tmp_path, cache):
    said = []
    first = prepare_base(_plan(), tmp_path / "a", log=said.append)
    assert first.made and first.seconds > 0
    [kept] = [d for d in cache.iterdir() if not d.name.startswith(".")]
    again = prepare_base(_plan(), tmp_path / "b", log=said.append)
    assert not again.made and again.seconds == 0 and again.dir == tmp_path / "b" / "warmstart"
    assert any(f"reusing the warm start made earlier with the same settings ({kept}" in s for s in said), said
    for name in ("model.safetensors", "config.json", "tokenizer.json", "warmstart_key.json"):
        assert (again.dir / name).read_bytes() == (first.dir / name).read_bytes(), name


def test_other_settings_a_damaged_entry_or_a_cache_turned_off_train_again(tmp_path, cache, monkeypatch):
    first = prepare_base(_plan(), tmp_path / "a", log=lambda s: None)
    [kept] = [d for d in cache.iterdir() if not d.name.startswith(".")]
    (kept / "warmstart_key.json").write_text("{}")  # another key under this name (or a damaged file)
    assert prepare_base(_plan(), tmp_path / "b", log=lambda s: None).made
    assert (kept / "warmstart_key.json").read_bytes() == (first.dir / "warmstart_key.json").read_bytes()  # redone
    assert prepare_base(_plan(seed=1), tmp_path / "c", log=lambda s: None).made  # the seed is in the key
    assert len([d for d in cache.iterdir() if not d.name.startswith(".")]) == 2
    monkeypatch.setenv("SCALERL_WARMSTART_CACHE", "0")
    assert warm_cache_dir() is None
    assert prepare_base(_plan(), tmp_path / "d", log=lambda s: None).made


@pytest.mark.parametrize("changed, stale", [
    ("experiments/base_models.py", True),  # the key, the makers and WARM_HEAD_DTYPE
    ("scalerl_jax/config.py", True),  # the warm start's TrainConfig takes its other fields' defaults from here
    ("scalerl_jax/models/llama.py", True),
    ("scalerl_jax/sharding.py", True),
    ("scalerl_jax/kernels/attention.py", True),
    ("scalerl_jax/train/warmstart.py", True),
    ("scalerl_jax/data/tasks.py", True),
    ("scalerl_jax/scaling/law.py", False),  # the fit does not shape a warm start
    ("experiments/run_path.py", False),  # nor does the RL run after it
])
def test_the_warm_start_cache_digest_covers_the_code_that_makes_one(tmp_path, cache, monkeypatch, changed, stale):
    """A one-byte change to a file the warm start depends on makes a cached warm start miss (wherever the file
    lives: a checkout or a wheel); other files leave the cache as it was."""
    key = warm_start_key(_plan())
    _fake_entry(cache, key)
    assert cached_warm_start(key) is not None
    read = Path.read_bytes
    monkeypatch.setattr(Path, "read_bytes", lambda self: read(self) + (b"#" if self.as_posix().endswith(changed)
                                                                         else b""))
    assert (cached_warm_start(key) is None) == stale


def _fake_entry(cache: Path, key: dict) -> Path:
    """A cache entry for ``key`` as a finished warm start leaves it (its key file; the weights do not matter here)."""
    d = cache / cache_name(key)
    d.mkdir(parents=True)
    (d / "warmstart_key.json").write_text(json.dumps(key, indent=2))
    return d


def _set(plan, path: str, value):
    """``plan`` with the field at ``path`` (``data.seed``, ``warm_lr``) set to ``value``, past the config's checks
    (only the key reads it here)."""
    section, _, name = path.rpartition(".")
    if not section:
        return R(plan, **{name: value})
    part = R(getattr(plan.exp, section))
    object.__setattr__(part, name, value)
    return R(plan, exp=R(plan.exp, **{section: part}))


# Every input the warm-start makers read (experiments/base_models.py: _make_char_arith, _make_word_arith and
# train/warmstart.py's warm_start), per kind of base model: each one changed alone must miss the cache.
SHAPES = {
    "tiny": [*(f"model.{f.name}" for f in dataclasses.fields(ModelConfig) if f.name != "head_dtype"),
             "data.source", "data.seed", "data.n_train", "data.val_size", "data.arith_b_max", "train.seed",
             "warm_seq_len", "warm_steps", "warm_batch", "warm_lr", "warm_warmup", "warm_unmarked_frac", "base_kind"],
    "tiny_chain": ["data.chain_depth_lo", "data.chain_depth_hi", "n_problems", "data.n_train"],
    "tiny_mathcode": ["data.code_val_size"],
    "small": ["n_problems", "arith_b_max", "bpe_vocab", "data.template", "data.val_size", "data.seed"],
}
#: settings of the RL run that its warm start does not read: the same cache entry serves every value
DOES_NOT_SHAPE = ["model.head_dtype", "train.lr", "train.steps", "rollout.max_new_tokens", "rollout.max_prompt_len",
                  "loss.kind", "data.npr", "forecast.enabled", "variant", "n_trainer_devices"]


def _changed(plan, path: str):
    """``plan`` with one field changed to another value of its kind (a string or a bool flipped, a number plus one,
    an unset field set)."""
    section, _, name = path.rpartition(".")
    old = getattr(getattr(plan.exp, section) if section else plan, name)
    new = (not old if isinstance(old, bool) else old + 1 if isinstance(old, (int, float)) else 1 if old is None
           else f"{old}!")
    return _set(plan, path, new)


@pytest.mark.parametrize("preset, field", [(p, f) for p, fields in SHAPES.items() for f in fields])
def test_each_setting_that_shapes_a_warm_start_misses_the_cache(cache, preset, field):
    plan = presets.PRESETS[preset](0)
    _fake_entry(cache, warm_start_key(plan))
    assert cached_warm_start(warm_start_key(plan)) is not None
    assert cached_warm_start(warm_start_key(_changed(plan, field))) is None, field


@pytest.mark.parametrize("field", DOES_NOT_SHAPE)
def test_settings_of_the_rl_run_alone_reuse_the_warm_start(cache, field):
    plan = presets.PRESETS["tiny"](0)
    kept = _fake_entry(cache, warm_start_key(plan))
    assert cached_warm_start(warm_start_key(_changed(plan, field))) == kept, field


#: modules a warm start imports that do not shape its result: the package roots (import hooks) and the plan's
#: dataclass with the presets and budgets it imports (every value they give the warm start is in its key)
IMPORTED_NOT_SHAPING = {"scalerl_jax", "scalerl_jax.hostmem", "scalerl_jax.experiments",
                        "scalerl_jax.experiments.presets", "scalerl_jax.experiments.budgets"}


def test_a_warm_start_imports_only_code_the_digest_covers(tmp_path):
    """Made in a fresh process, a warm start loads no module of the project outside WARM_CODE (or the
    modules that shape nothing, above): a change anywhere it reads makes the cached warm starts stale."""
    code = ("import json, sys\n"
            "from tests.test_base_models import _plan\n"
            "from scalerl_jax.experiments.base_models import prepare_base\n"
            f"prepare_base(_plan(), __import__('pathlib').Path({str(tmp_path)!r}), log=lambda s: None)\n"
            "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] == 'scalerl_jax')))\n")
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=600,
                         env={**__import__("os").environ, "SCALERL_WARMSTART_CACHE": "0"})
    assert res.returncode == 0, res.stderr[-3000:]
    loaded = json.loads(res.stdout.strip().splitlines()[-1])
    assert "scalerl_jax.train.warmstart" in loaded
    outside = [m for m in loaded if m not in IMPORTED_NOT_SHAPING
               and not any(m == w or m.startswith(w + ".") for w in WARM_CODE)]
    assert not outside, outside
