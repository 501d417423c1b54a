"""The pure train step: ``train_step(state, batch) -> (state, metrics)``, jitted with explicit shardings.

The loss is a parameter: ``loss_fn(params, batch) -> (loss, aux)``. If ``aux`` carries ``"update_ok"``
(a boolean scalar; e.g. False when the batch holds NaNs), the step is skipped when it is False in
any micro-batch; if it carries ``"n_tokens"`` the step is skipped when no token is left to train on. A step is
also skipped when the loss or the gradient is non-finite. A skipped
step returns the previous params and optimiser state bit for bit and reports ``skipped = 1``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh

from scalerl_jax import sharding as shd
from scalerl_jax.config import ModelConfig
from scalerl_jax.models.model import abstract_params, param_axes

LossFn = Callable[[Any, dict[str, jax.Array]], tuple[jax.Array, dict[str, jax.Array]]]


class TrainState(NamedTuple):
    step: jax.Array  # int32 scalar: number of applied (not skipped) updates
    params: Any
    opt_state: Any


def init_train_state(params: Any, optimizer: optax.GradientTransformation) -> TrainState:
    return TrainState(jnp.zeros((), jnp.int32), params, optimizer.init(params))


def _split_micro(batch: dict[str, jax.Array], m: int) -> dict[str, jax.Array]:
    def split(a):
        if a.shape[0] % m:
            raise ValueError(f"batch dimension {a.shape[0]} is not divisible by microbatches={m}")
        return a.reshape(m, a.shape[0] // m, *a.shape[1:])

    return jax.tree.map(split, batch)


def make_train_step(
    loss_fn: LossFn, optimizer: optax.GradientTransformation, microbatches: int = 1
) -> Callable[[TrainState, dict[str, jax.Array]], tuple[TrainState, dict[str, jax.Array]]]:
    """Build the pure step. With ``microbatches > 1`` the batch's leading dimension is split and the
    gradients (and aux metrics) are averaged over a ``lax.scan``; activations of one micro-batch at a time."""
    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)

    def compute(params, batch):
        if microbatches == 1:
            return grad_fn(params, batch)
        micro = _split_micro(batch, microbatches)

        def combine(a, b):  # booleans (e.g. update_ok) must hold in every micro-batch; numbers are summed
            return jnp.logical_and(a, b) if a.dtype == jnp.bool_ else a + b

        inv = 1.0 / microbatches
        # The 1/M of the average is folded into each micro-batch's loss so the accumulated gradient is already
        # the mean: scaling it afterwards wrote a fresh gradient-sized buffer per leaf (~25 GB per device for
        # the 109B MoE).
        def scale(x):
            return x * inv if jnp.issubdtype(x.dtype, jnp.floating) else x

        scaled_grad_fn = jax.value_and_grad(lambda p, b: jax.tree.map(scale, loss_fn(p, b)), has_aux=True)

        def body(acc, mb):
            # Tie the weights to this micro-batch: what is computed from them alone (the all-gathers of FSDP-sharded
            # weights outside the layer scan: embedding, LM head) is then no longer loop-invariant, so XLA's
            # while-loop-invariant code motion cannot hoist full gathered copies out of the loop and keep them
            # alive through all micro-batches (Scout: two 3.9 GB f32 copies of the LM head per device).
            p, mb = jax.lax.optimization_barrier((params, mb))
            (loss, aux), g = scaled_grad_fn(p, mb)
            return jax.tree.map(combine, acc, (loss, aux, g)), None

        (loss0, aux0), _ = jax.eval_shape(grad_fn, params, jax.tree.map(lambda a: a[0], micro))
        init = jax.tree.map(lambda s: jnp.ones(s.shape, s.dtype) if s.dtype == jnp.bool_
                            else jnp.zeros(s.shape, s.dtype),
                            (loss0, aux0))
        init = (*init, jax.tree.map(jnp.zeros_like, params))
        (loss, aux, g), _ = jax.lax.scan(body, init, micro)
        return (loss, aux), g

    def train_step(state: TrainState, batch: dict[str, jax.Array]) -> tuple[TrainState, dict[str, jax.Array]]:
        (loss, aux), grads = compute(state.params, batch)
        aux = dict(aux)
        gnorm = optax.global_norm(grads)
        ok = jnp.isfinite(loss) & jnp.isfinite(gnorm)
        if "update_ok" in aux:
            ok = ok & aux.pop("update_ok").astype(jnp.bool_)
        if "n_tokens" in aux:  # nothing survived filtering: an update of zero gradients would still decay weights
            ok = ok & (aux["n_tokens"] > 0)
        # A skipped step returns the state untouched. lax.cond rather than where(ok, new, old) over every leaf:
        # the select kept the old and the new parameters and moments alive at once and forced extra
        # gradient-sized copies (for the 109B MoE preset each copy is ~25 GB per device).
        def apply(operand):
            params, opt_state, g = operand
            updates, new_opt = optimizer.update(g, opt_state, params)
            return optax.apply_updates(params, updates), new_opt

        new_params, new_opt = jax.lax.cond(ok, apply, lambda operand: operand[:2],
                                           (state.params, state.opt_state, grads))
        new_state = TrainState(state.step + ok.astype(jnp.int32), new_params, new_opt)
        metrics = {"loss": loss, "grad_norm": gnorm, "skipped": 1 - ok.astype(jnp.int32), **aux}
        return new_state, metrics

    return train_step


def state_shardings(
    model_cfg: ModelConfig, optimizer: optax.GradientTransformation, mesh: Mesh,
    rules: shd.ShardingRules = shd.DEFAULT_RULES,
) -> tuple[TrainState, TrainState]:
    """(abstract TrainState, TrainState of NamedShardings) for ``model_cfg`` on ``mesh``."""
    params_abs = abstract_params(model_cfg)
    p_shard = shd.tree_shardings(param_axes(model_cfg), params_abs, mesh, rules)
    opt_abs = jax.eval_shape(optimizer.init, params_abs)
    o_shard = shd.opt_state_shardings(opt_abs, params_abs, p_shard, mesh)
    abstract = TrainState(jax.ShapeDtypeStruct((), jnp.int32), params_abs, opt_abs)
    return abstract, TrainState(shd.replicated(mesh), p_shard, o_shard)


def jit_train_step(
    step_fn, state_sharding: TrainState, batch_sharding: Any, mesh: Mesh,
    rules: shd.ShardingRules = shd.DEFAULT_RULES,
):
    """``jax.jit`` the step with explicit in/out shardings and the state donated. Activation sharding
    constraints inside the model are active because tracing happens under :func:`sharding.use_mesh`."""

    def traced(state, batch):
        with shd.use_mesh(mesh, rules):
            return step_fn(state, batch)

    return jax.jit(
        traced,
        in_shardings=(state_sharding, batch_sharding),
        out_shardings=(state_sharding, shd.replicated(mesh)),
        donate_argnums=(0,),
    )
