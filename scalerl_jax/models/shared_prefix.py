"""A causal pass over groups of rows that continue one prompt each, computing every prompt once.

An RL batch holds ``n`` completions of each prompt (a group). The plain forward (:func:`scalerl_jax.models.
forward_hidden`) runs each row's prompt again; here a group's prompt is one *prefix* row and its completions are
rows of their own that attend to it:

    prefix_GP     [G, P] int32   the group's prompt, right-padded within P columns
    prompt_len_G  [G]    int32   its length (positions >= prompt_len are padding: no query sees them)
    comp_BC       [B, C] int32   completions, B = G * n, row b of group b // n; its token j is at position
                                 prompt_len + j

Every layer runs its projections and SwiGLU on G x P + B x C tokens instead of B x (P + C); in attention, a prefix
query sees the prompt's keys up to its own position, and a completion query sees its group's prompt keys (all
``prompt_len`` of them) and its own completion's keys up to its position: exactly the keys it sees in the plain
pass over the row ``prompt + completion``, at the same positions (RoPE). The hidden states therefore equal the
plain pass's up to the order of float summation, and so do their gradients (a prefix's gradient is the sum over its
group's rows, which autodiff gives through the broadcast of its keys and values).

It takes the dense softmax for both (:func:`scalerl_jax.models.layers.dense_attention`), so :func:`supported`
admits the dense architectures (Llama, Qwen2, Qwen3) with the reference attention, no rematerialisation, and rows
that fit one attention chunk: the CPU presets' shapes. Other models train on the plain rows.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from scalerl_jax.config import ModelConfig
from scalerl_jax.models import layers as nn
from scalerl_jax.models.params import Params

DENSE_ARCHS = ("llama", "qwen2", "qwen3")


def supported(cfg: ModelConfig, seq_len: int) -> str | None:
    """None when ``cfg`` can train on shared prefixes at rows of ``seq_len`` tokens, else why not."""
    if cfg.arch not in DENSE_ARCHS:
        return f"arch={cfg.arch!r} (the shared-prefix pass covers {', '.join(DENSE_ARCHS)})"
    if cfg.attention_impl != "reference":
        return f"attention_impl={cfg.attention_impl!r} (it takes the reference dense attention)"
    if cfg.remat:
        return "remat=True (it does not rematerialise its layers)"
    if seq_len > cfg.attn_chunk:
        return f"rows of {seq_len} tokens > attn_chunk={cfg.attn_chunk} (it takes one dense softmax per row)"
    return None


def _rope(x, rope):
    return nn.apply_rope(x, *rope)


def _attend(q_BTHD, k_BSKD, v_BSKD, mask_BTS):
    B, T, H, Dh = q_BTHD.shape
    K = k_BSKD.shape[2]
    o = nn.dense_attention(q_BTHD.reshape(B, T, K, H // K, Dh), k_BSKD, v_BSKD, mask_BTS)
    return o.reshape(B, T, H, Dh)


def forward_shared(params: Params, prefix_GP: jax.Array, prompt_len_G: jax.Array, comp_BC: jax.Array,
                   cfg: ModelConfig) -> tuple[jax.Array, jax.Array]:
    """Final-norm hidden states of the prefixes [G, P, D] and of the completions [B, C, D] (module docstring)."""
    G, P = prefix_GP.shape
    B, C = comp_BC.shape
    if B % G:
        raise ValueError(f"{B} completion rows do not split into {G} groups")
    n = B // G
    dt = nn.dtype(cfg.dtype)
    plen_B = jnp.repeat(prompt_len_G, n)
    ppos_GP = jnp.broadcast_to(jnp.arange(P, dtype=jnp.int32), (G, P))
    cpos_BC = plen_B[:, None] + jnp.arange(C, dtype=jnp.int32)[None]
    inv = nn.rope_inv_freq(cfg)
    rope_p, rope_c = nn.rope_tables(ppos_GP, inv), nn.rope_tables(cpos_BC, inv)
    valid_GP = ppos_GP < prompt_len_G[:, None]
    mask_p = nn.causal_mask(ppos_GP, ppos_GP) & valid_GP[:, None, :]
    mask_c = jnp.concatenate([jnp.broadcast_to(jnp.repeat(valid_GP, n, axis=0)[:, None, :], (B, C, P)),
                              nn.causal_mask(cpos_BC, cpos_BC)], axis=-1)

    def layer(carry, lp):
        x_p, x_c = carry
        with jax.named_scope("layer"):
            with jax.named_scope("attention"):
                q_p, k_p, v_p = nn.project_qkv(x_p, lp, cfg)
                q_c, k_c, v_c = nn.project_qkv(x_c, lp, cfg)
                q_p, k_p, q_c, k_c = _rope(q_p, rope_p), _rope(k_p, rope_p), _rope(q_c, rope_c), _rope(k_c, rope_c)
                o_p = _attend(q_p, k_p, v_p, mask_p)
                k_all = jnp.concatenate([jnp.repeat(k_p, n, axis=0), k_c], axis=1)
                v_all = jnp.concatenate([jnp.repeat(v_p, n, axis=0), v_c], axis=1)
                o_c = _attend(q_c, k_all, v_all, mask_c)
                wo = lp["wo"].astype(dt)
                x_p, x_c = x_p + nn.proj(o_p, wo, n_in=2), x_c + nn.proj(o_c, wo, n_in=2)
            x_p = nn.ffn_block(x_p, lp["mlp_norm"], lp, cfg)
            x_c = nn.ffn_block(x_c, lp["mlp_norm"], lp, cfg)
        return (x_p, x_c), None

    x0 = (nn.embed(params["embed"], prefix_GP, cfg), nn.embed(params["embed"], comp_BC, cfg))
    (x_p, x_c), _ = jax.lax.scan(layer, x0, params["layers"], unroll=True)
    norm = params["final_norm"]
    return nn.rms_norm(x_p, norm, cfg.rms_eps), nn.rms_norm(x_c, norm, cfg.rms_eps)


def predicting_states(h_p_GPD: jax.Array, h_c_BCD: jax.Array, prompt_len_G: jax.Array) -> jax.Array:
    """[B, C, D]: the hidden state that predicts completion token j: the prompt's last one for j = 0, the
    completion's token j - 1 after it."""
    G = h_p_GPD.shape[0]
    n = h_c_BCD.shape[0] // G
    last = jnp.take_along_axis(h_p_GPD, jnp.maximum(prompt_len_G - 1, 0)[:, None, None], axis=1)  # [G, 1, D]
    return jnp.concatenate([jnp.repeat(last, n, axis=0), h_c_BCD[:, :-1]], axis=1)
