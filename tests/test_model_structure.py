"""The model package's structure: imports run one way (no circle anywhere in the package; ``models/`` needs only
``config``, ``sharding`` and the attention kernels outside itself), every weight is declared once with shape, axes,
dtype and initialiser that agree with each other and with independent counts, and the KV-cached decode at T = 1
reproduces the full forward pass."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from scalerl_jax.models import (
    forward,
    forward_cached,
    init_cache,
    init_params,
    llama3_8b,
    lm_logits,
    param_specs,
    tiny,
    tiny_moe,
)
from scalerl_jax.models.layers import dtype
from scalerl_jax.models.params import Weight
from scalerl_jax.sharding import ShardingRules
from tests.tolerances import max_rel, model_rel

ROOT = Path(__file__).resolve().parents[1]


# folder -> its import name (pyproject.toml maps experiments/ and benchmarks/ into scalerl_jax)
IMPORT_NAMES = {"scalerl_jax": "scalerl_jax", "experiments": "scalerl_jax.experiments",
                "benchmarks": "scalerl_jax.benchmarks"}


def _import_graph(*folders: str) -> dict[str, set[str]]:
    """Module -> the modules of ``folders`` it imports (module level and inside functions alike)."""
    files = {}
    for folder in folders:
        for p in (ROOT / folder).rglob("*.py"):
            name = ".".join((IMPORT_NAMES[folder], *p.relative_to(ROOT / folder).with_suffix("").parts))
            files[name.removesuffix(".__init__")] = p
    graph = {}
    for name, p in files.items():
        deps = set()
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                for a in node.names:
                    full = f"{node.module}.{a.name}"
                    deps.add(full if full in files else node.module)
            elif isinstance(node, ast.Import):
                deps.update(a.name for a in node.names)
        graph[name] = {d for d in deps if d in files and d != name}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected component of more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    return out


def test_the_package_imports_have_no_circle():
    graph = _import_graph("scalerl_jax", "experiments", "benchmarks")
    assert len(graph) > 50  # the walk found the package
    assert "scalerl_jax.benchmarks.gpu_check_driver" in graph["scalerl_jax.benchmarks.gpu_check"]
    assert _cycles(graph) == []


def test_the_cycle_finder_finds_a_circle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_models_depend_on_config_sharding_and_the_kernels_only():
    graph = _import_graph("scalerl_jax")
    outside = {d for m, deps in graph.items() if m.startswith("scalerl_jax.models") for d in deps
               if not d.startswith("scalerl_jax.models")}
    assert outside == {"scalerl_jax.config", "scalerl_jax.sharding", "scalerl_jax.kernels.attention"}
    # the layers module is the bottom of the model stack: no model module below it
    assert not {d for d in graph["scalerl_jax.models.layers"] if d.startswith("scalerl_jax.models")}
    for arch in ("llama", "llama4", "moe"):
        assert "scalerl_jax.models.model" not in graph[f"scalerl_jax.models.{arch}"]
    assert "scalerl_jax.models.llama" not in graph["scalerl_jax.models.llama4"]


def _imports(path: Path) -> set[str]:
    """Every module a file imports (module level and inside functions alike)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return out


def test_kernels_sit_below_the_models():
    """The models may call ``scalerl_jax.kernels`` (the attention dispatch in layers.py, imported inside the function
    that needs it); kernels need nothing of the project but its config, so no circle can form."""
    for p in (ROOT / "scalerl_jax" / "kernels").rglob("*.py"):
        project = {m for m in _imports(p) if m.split(".")[0] == "scalerl_jax"}
        assert project <= {"scalerl_jax.config"}, (p.name, project)
    users = {p.name for p in (ROOT / "scalerl_jax" / "models").rglob("*.py")
             if any(m.startswith("scalerl_jax.kernels") for m in _imports(p))}
    assert users == {"layers.py"}


def _weights(specs) -> list[tuple[str, Weight]]:
    flat = jax.tree_util.tree_flatten_with_path(specs, is_leaf=lambda x: isinstance(x, Weight))[0]
    return [("/".join(str(k.key) for k in path), w) for path, w in flat]


@pytest.mark.parametrize("make", [tiny, tiny_moe, llama3_8b], ids=["tiny", "tiny_moe", "llama3_8b"])
def test_each_declaration_is_consistent(make):
    cfg = make()
    rules = ShardingRules()
    ws = _weights(param_specs(cfg))
    for name, w in ws:
        assert len(w.shape) == len(w.axes), name
        for ax in w.axes:
            rules.mesh_axes(ax)  # every logical axis has a sharding rule (KeyError otherwise)
        assert w.dtype == cfg.param_dtype, name
        want = "ones" if name.split("/")[-1].endswith("norm") else (
            "out_proj" if name.split("/")[-1] in ("wo", "w_down", "shared_down") else "normal")
        assert w.init == want, name
    # the declared sizes add up to the config's own hand-written parameter count
    assert sum(int(np.prod(w.shape)) for _, w in ws) == cfg.num_params()


def test_the_8b_declaration_has_llama_3_1_8b_s_published_size():
    assert sum(int(np.prod(w.shape)) for _, w in _weights(param_specs(llama3_8b()))) == 8_030_261_248


def test_initialisers_follow_their_declaration():
    cfg = dataclasses.replace(tiny(), n_layers=8)
    params = init_params(cfg, jax.random.key(0), std=0.05)
    lay = params["layers"]
    np.testing.assert_array_equal(lay["attn_norm"], 1.0)
    np.testing.assert_array_equal(params["final_norm"], 1.0)
    # N(0, std) and N(0, std / sqrt(2 L)): the sample std of n normal draws has a relative standard error of
    # 1 / sqrt(2 n); 6 of them
    for name, want in (("wq", 0.05), ("w_down", 0.05 / np.sqrt(16)), ("wo", 0.05 / np.sqrt(16))):
        w = lay[name]
        assert abs(float(jnp.std(w)) / want - 1) < 6 / np.sqrt(2 * w.size), name


def test_the_dtype_table_names_the_field():
    assert dtype("bfloat16") == jnp.bfloat16 and dtype("float32") == jnp.float32
    with pytest.raises(ValueError, match="head_dtype must be one of"):
        dtype("float16", what="head_dtype")


def _local(cfg):
    return dataclasses.replace(cfg, local_attn_chunk=8) if cfg.arch == "llama4" else cfg


@pytest.mark.parametrize("make", [tiny, tiny_moe], ids=["llama", "llama4"])
def test_decode_one_token_at_a_time_equals_the_full_forward(make):
    """Prefill 5 tokens, then decode the rest one position per call (crossing Llama 4's 8-position attention
    chunks): every position's logits equal the cache-free forward pass over the whole sequence."""
    cfg = _local(make())
    params = init_params(cfg, jax.random.key(1), std=0.1)
    T = 20
    tokens = jax.random.randint(jax.random.key(2), (3, T), 0, cfg.vocab_size)
    full = np.asarray(forward(params, tokens, cfg))
    cache = init_cache(cfg, 3, 24)
    h, cache = forward_cached(params, tokens[:, :5], jnp.broadcast_to(jnp.arange(5), (3, 5)), cache, cfg)
    got = [np.asarray(lm_logits(params, h, cfg))]
    step = jax.jit(lambda p, t, pos, c: forward_cached(p, t, pos, c, cfg))
    for t in range(5, T):
        h, cache = step(params, tokens[:, t:t + 1], jnp.full((3, 1), t), cache)
        got.append(np.asarray(lm_logits(params, h, cfg)))
    # two float32 orderings of the model (tests/tolerances.py), relative to the largest logit
    assert max_rel(np.concatenate(got, axis=1), full) <= model_rel(cfg, T)
    # the cache holds each position's keys in its slot: slot t of layer 0 is nonzero exactly for t < T
    assert len(cache) == cfg.n_layers
    filled = np.abs(np.asarray(cache[0]["k"])).sum(axis=(1, 3)) > 0  # [B, S]
    assert filled[:, :T].all() and not filled[:, T:].any()
