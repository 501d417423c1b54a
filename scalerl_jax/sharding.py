"""Logical axis names -> mesh axes, mesh construction and NamedSharding helpers.

Every parameter and the main activations carry logical axis names (each weight declares its own: see
``scalerl_jax.models.params.Weight``). A :class:`ShardingRules` table maps each logical name to
zero, one or several mesh axes (``data``, ``fsdp``, ``tensor``, ``expert``). A dimension whose size does not
divide by its mesh axes is replicated instead, so one rules
table serves the tiny model and the 8B preset.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from scalerl_jax.config import ConfigError, MeshConfig

MeshAxes = str | tuple[str, ...] | None


@dataclasses.dataclass(frozen=True)
class ShardingRules:
    """Logical axis name -> mesh axis (or tuple of axes, or None for replicated)."""

    # The MoE model's ``expert`` axis doubles as a data / FSDP axis for everything that is not an expert
    # weight (tokens and dense weights are sharded over it too); for a dense model it has size 1.
    batch: MeshAxes = ("data", "fsdp", "expert")
    seq: MeshAxes = None
    embed: MeshAxes = ("fsdp", "expert")  # the d_model dimension of weights (FSDP shards it)
    act_embed: MeshAxes = None  # the d_model dimension of activations
    vocab: MeshAxes = "tensor"
    q_heads: MeshAxes = "tensor"
    kv_heads: MeshAxes = "tensor"
    head_dim: MeshAxes = None
    mlp: MeshAxes = "tensor"
    layers: MeshAxes = None
    norm: MeshAxes = None
    experts: MeshAxes = "expert"

    def mesh_axes(self, logical: str | None) -> MeshAxes:
        if logical is None:
            return None
        if not hasattr(self, logical):
            raise KeyError(f"ShardingRules has no rule for logical axis {logical!r}")
        return getattr(self, logical)


DEFAULT_RULES = ShardingRules()


def make_mesh(cfg: MeshConfig, devices: Sequence[jax.Device] | None = None) -> Mesh:
    """Build a ``Mesh`` with axes (data, fsdp, tensor, expert) from ``cfg`` over ``devices``.

    Raises ConfigError naming the shape when it does not match the device count.
    """
    devices = list(jax.devices() if devices is None else devices)
    sizes = cfg.resolve(len(devices))
    shape = tuple(sizes[a] for a in MeshConfig.AXES)
    return Mesh(np.asarray(devices, dtype=object).reshape(shape), MeshConfig.AXES)


def abstract_mesh(cfg: MeshConfig, n_devices: int) -> Mesh:
    """A mesh over the first ``n_devices`` devices (for AOT compiles on simulated CPU devices)."""
    devs = jax.devices()
    if len(devs) < n_devices:
        raise ConfigError(
            f"need {n_devices} devices for this mesh but JAX sees {len(devs)}; on CPU set "
            f"XLA_FLAGS=--xla_force_host_platform_device_count={n_devices} before importing jax"
        )
    return make_mesh(cfg, devs[:n_devices])


def as_axes(axes: MeshAxes) -> tuple[str, ...]:
    """A rule's or a spec entry's mesh axes as a tuple: None -> (), "fsdp" -> ("fsdp",)."""
    if axes is None:
        return ()
    return (axes,) if isinstance(axes, str) else tuple(axes)


def _axis_size(mesh: Mesh, axes: MeshAxes) -> int:
    return math.prod(mesh.shape[a] for a in as_axes(axes))


def logical_to_spec(
    logical: Sequence[str | None], shape: Sequence[int] | None, mesh: Mesh, rules: ShardingRules = DEFAULT_RULES
) -> P:
    """PartitionSpec for an array with the given logical axes.

    Mesh axes of size 1 are dropped; a dimension not divisible by its mesh axes is replicated; a mesh
    axis is used at most once per array (the first dimension claiming it wins).
    """
    used: set[str] = set()
    spec = []
    for i, name in enumerate(logical):
        axes = tuple(a for a in as_axes(rules.mesh_axes(name))
                     if a in mesh.shape and mesh.shape[a] > 1 and a not in used)
        if axes and shape is not None and shape[i] % _axis_size(mesh, axes) != 0:
            axes = ()
        used.update(axes)
        spec.append(None if not axes else axes[0] if len(axes) == 1 else axes)
    return P(*spec)


def tree_shardings(axes_tree: Any, abstract_tree: Any, mesh: Mesh, rules: ShardingRules = DEFAULT_RULES) -> Any:
    """NamedShardings for a pytree given a matching pytree of logical-axis tuples."""
    return jax.tree.map(
        lambda ax, a: NamedSharding(mesh, logical_to_spec(ax, a.shape, mesh, rules)),
        axes_tree,
        abstract_tree,
        is_leaf=lambda x: isinstance(x, tuple),
    )


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, P())


def batch_sharding(mesh: Mesh, ndim: int, rules: ShardingRules = DEFAULT_RULES) -> NamedSharding:
    """Shard the leading (batch) dimension over the batch mesh axes, replicate the rest."""
    axes = tuple(a for a in as_axes(rules.batch) if mesh.shape.get(a, 1) > 1)
    first = None if not axes else axes[0] if len(axes) == 1 else axes
    return NamedSharding(mesh, P(first, *([None] * (ndim - 1))))


def batch_shards(mesh: Mesh, rules: ShardingRules = DEFAULT_RULES) -> int:
    """How many ways :func:`batch_sharding` splits the leading dimension (a batch's rows must be a multiple)."""
    return int(np.prod([mesh.shape[a] for a in as_axes(rules.batch) if mesh.shape.get(a, 1) > 1], dtype=np.int64))


def batch_shardings(batch: Any, mesh: Mesh, rules: ShardingRules = DEFAULT_RULES) -> Any:
    return jax.tree.map(lambda a: batch_sharding(mesh, np.ndim(a) if not hasattr(a, "ndim") else a.ndim, rules), batch)


def opt_state_shardings(opt_state_abstract: Any, params_abstract: Any, param_shardings: Any, mesh: Mesh) -> Any:
    """Shardings for an optax state: leaves that mirror a parameter (Adam's mu / nu) take that
    parameter's sharding; everything else (counts, scalars) is replicated."""
    by_path: dict[tuple, tuple] = {}
    flat_params = jax.tree_util.tree_flatten_with_path(params_abstract)[0]
    for (path, leaf), sharding in zip(flat_params, jax.tree.leaves(param_shardings)):
        by_path[tuple(str(k) for k in path)] = (tuple(leaf.shape), sharding)

    def pick(path, leaf):
        keys = tuple(str(k) for k in path)
        for start in range(len(keys)):
            hit = by_path.get(keys[start:])
            if hit is not None and tuple(hit[0]) == tuple(leaf.shape):
                return hit[1]
        return replicated(mesh)

    return jax.tree_util.tree_map_with_path(pick, opt_state_abstract)


# ---- activation sharding constraints -------------------------------------------------------------
_ACTIVE: list[tuple[Mesh, ShardingRules]] = []


@contextlib.contextmanager
def use_mesh(mesh: Mesh | None, rules: ShardingRules = DEFAULT_RULES):
    """Within this context (at trace time), :func:`constrain` pins activations to the mesh."""
    if mesh is None:
        yield
        return
    _ACTIVE.append((mesh, rules))
    try:
        yield
    finally:
        _ACTIVE.pop()


def current_mesh() -> tuple[Mesh, ShardingRules] | None:
    """The (mesh, rules) of the innermost :func:`use_mesh`, or None outside one."""
    return _ACTIVE[-1] if _ACTIVE else None


def constrain(x: jax.Array, logical: Sequence[str | None]) -> jax.Array:
    """``with_sharding_constraint`` by logical axes; identity outside :func:`use_mesh`."""
    if not _ACTIVE:
        return x
    mesh, rules = _ACTIVE[-1]
    return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, logical_to_spec(logical, x.shape, mesh, rules)))


def per_shard(fn, args: Sequence[Any], logical: Sequence[Sequence[str | None]], out_like: Sequence[tuple[int, int]]):
    """``fn(*args)`` run on each device's block of the arguments (``jax.shard_map``) under the active mesh, and
    plainly outside one or when the mesh shards none of the arguments.

    For kernels GSPMD cannot partition (a ``pallas_call``): under a sharded ``jit`` such a
    call would otherwise receive whole, all-gathered operands on every device. ``logical`` gives each argument's
    logical axes (``()`` for a scalar), mapped by the active rules like any activation (a dimension its mesh axes
    do not divide stays whole); ``out_like`` gives, per output of ``fn``, ``(index of the argument whose spec it
    takes, the output's rank)``: the output's leading dimensions are split as that argument's. ``fn`` must be
    correct on any block along the sharded dimensions (rows of a batch, whole heads). A mesh axis none of the
    arguments use runs ``fn`` on whole copies there; gradients of an argument replicated over a mesh axis are
    summed over that axis by ``shard_map``'s transpose."""
    active = current_mesh()
    if active is None:
        return fn(*args)
    mesh, rules = active
    specs = tuple(logical_to_spec(ax, np.shape(a), mesh, rules) for ax, a in zip(logical, args, strict=True))
    if not any(any(x is not None for x in spec) for spec in specs):
        return fn(*args)
    outs = tuple(P(*(tuple(specs[i]) + (None,) * rank)[:rank]) for i, rank in out_like)
    return jax.shard_map(fn, mesh=mesh, in_specs=specs, out_specs=outs[0] if len(outs) == 1 else outs,
                         check_vma=False)(*args)
