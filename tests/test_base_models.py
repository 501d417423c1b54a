"""experiments/base_models.py's warm-start cache: a warm start a run made is reused by a later run with the same
settings (byte for byte), never by one with other settings, and not at all when the cache is off."""

import dataclasses
from pathlib import Path

import pytest
from scalerl_jax.experiments import presets
from scalerl_jax.experiments.base_models import prepare_base, warm_cache_dir

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
    ("experiments/common.py", True),  # the warm start's key and WARM_HEAD_DTYPE
    ("experiments/base_models.py", True),
    ("scalerl_jax/models/llama.py", True),
    ("scalerl_jax/train/warmstart.py", True),
    ("scalerl_jax/data/tasks.py", True),
    ("scalerl_jax/scaling/law.py", False),  # the fit does not shape a warm start
])
def test_the_warm_start_cache_digest_covers_the_code_that_makes_one(monkeypatch, changed, stale):
    """A one-byte change to a file the warm start depends on makes a new cache key (wherever the file lives:
    a checkout or a wheel); other files leave it as it was."""
    from scalerl_jax.experiments import base_models

    before = base_models._code_digest()
    read = Path.read_bytes
    monkeypatch.setattr(Path, "read_bytes", lambda self: read(self) + (b"#" if self.as_posix().endswith(changed)
                                                                         else b""))
    assert (base_models._code_digest() != before) == stale
