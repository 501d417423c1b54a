"""Tolerances derived from floating-point rounding, for every comparison of computed floats in the suite.

A tolerance tuned on one machine fails on the next: XLA picks its reduction order (vector width, blocking, fusion)
per CPU and per compile, so the same float32 work rounds differently elsewhere. Each test therefore allows what
rounding can change, from the dtype's unit roundoff and the sizes of the reductions involved, with a comment saying
which bound it uses. Notation: ``u`` is the unit roundoff, half the machine epsilon (float32 2**-24 ~ 6.0e-8,
bfloat16 2**-8 ~ 3.9e-3, float64 2**-53 ~ 1.1e-16).

- k rounded operations in sequence (a closed form worked by hand): relative error <= gamma_k = k u / (1 - k u)
  (Higham, *Accuracy and Stability of Numerical Algorithms*, 2nd ed., Lemma 3.1). :func:`ops`.
- Transcendentals (exp, log, log1p, tanh, sin, ...) on XLA's CPU are polynomial approximations, not correctly
  rounded: each counts as :data:`TRANSCENDENTAL` roundings.
- A sum or dot product of n terms, in any order: |computed - exact| <= gamma_n * sum|terms| (Higham eq. 3.5 and
  §4.2); with rounding errors that are independent and of mean zero, lambda * sqrt(n) * u * sum|terms| holds with
  probability at least 1 - 2n exp(-lambda**2 / 2) (Higham and Mary, SIAM J. Sci. Comput. 41(5), 2019, Thm 3.1):
  for lambda = 8 (:data:`LAMBDA`) a failure chance below 3e-14 per rounding. :func:`sum_rel` takes the smaller.
- Two evaluations of the same math in different orders each lie within the bound of the exact value, so they
  differ by at most twice it: :func:`reorder_rel`.
- A network (:func:`model_rel`): the roundings on the path to one output entry (every term of every reduction the
  entry depends on through its layers, :func:`model_roundings`) add as a random walk, lambda * sqrt(N) * u,
  relative to the scale of the compared tensor (its largest entry); the residual, normalised layers pass a relative
  perturbation on with a gain of about one. Two orderings: twice that.
- Work done in bfloat16 (activations stored in bfloat16, float32 accumulation): the a-priori bound is too loose to
  test anything, so such tests measure instead: the bfloat16 result's own error against the same computation in
  float32 (whose error is ~2**16 times smaller) sets the scale, and two bfloat16 orderings may differ by
  :data:`OWN_ERROR_FACTOR` times it (each is off the float32 result by its rounding; the factor lets one be up to
  twice as far off as the other). :func:`own_error_tol`.

Statistical tolerances (a fit's parameters, a sampler's frequencies, a learning run against a threshold) are not
rounding: each of those tests states the noise its margin is measured against, next to the assertion.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["LAMBDA", "OWN_ERROR_FACTOR", "TRANSCENDENTAL", "attention_rel", "check_train_steps", "entropy_err",
           "gamma", "head_reference", "logit_err", "logsoftmax_err", "max_logit", "max_rel", "model_logprob_tol",
           "model_rel", "model_roundings", "moe_layer_rel", "ops", "own_error_tol", "reorder_rel", "rl_loss_scale",
           "sum_rel", "train_steps_tol", "unit_roundoff"]

#: standard deviations of the probabilistic bounds (see the module docstring)
LAMBDA = 8.0
#: roundings one transcendental function counts for (XLA CPU's approximations are within a few ulp)
TRANSCENDENTAL = 4
#: how far two low-precision orderings may differ, in units of the reference's own error (module docstring)
OWN_ERROR_FACTOR = 3.0


def unit_roundoff(dtype) -> float:
    """Half the machine epsilon of ``dtype`` (a NumPy / JAX dtype or its name, bfloat16 included)."""
    import jax.numpy as jnp

    return float(jnp.finfo(jnp.dtype(dtype)).eps) / 2.0


def gamma(n: int, dtype="float32") -> float:
    """Higham's gamma_n = n u / (1 - n u): the worst-case relative error of n rounded operations."""
    nu = n * unit_roundoff(dtype)
    return nu / (1.0 - nu) if nu < 1.0 else math.inf


def ops(k: int, dtype="float32", transcendental: int = 0) -> float:
    """Relative error bound of a closed form of ``k`` rounded arithmetic operations and ``transcendental`` calls to
    exp / log / tanh / ..., worst case."""
    return gamma(k + TRANSCENDENTAL * transcendental, dtype)


def sum_rel(n: int, dtype="float32") -> float:
    """Error bound of a sum (or dot product) of ``n`` terms in any order, relative to the sum of their absolute
    values: the smaller of the worst case gamma_n and the probabilistic lambda sqrt(n) u."""
    return min(gamma(n, dtype), LAMBDA * math.sqrt(n) * unit_roundoff(dtype))


def reorder_rel(n: int, dtype="float32") -> float:
    """How far two evaluations of the same ``n``-term sum in different orders can lie apart, relative to the sum of
    the absolute values of the terms."""
    return 2.0 * sum_rel(n, dtype)


def model_roundings(cfg, seq_len: int, backward: bool = False) -> int:
    """The roundings on the path to one output entry of a forward pass of ``cfg`` (a ModelConfig) over ``seq_len``
    positions: per layer the attention's input norm, q/k/v projections (and their biases), the per-head q/k norms
    where the architecture has them (Qwen3), scores, softmax, the weighted sum of values, the output projection and
    residual add, the MLP's norm, gate/up projections, activation, down projection and residual (for an MoE layer
    the router, the top-k experts' MLPs, the shared expert's where there is one (Llama 4), and their combination);
    then the final norm, the LM head and the log-softmax. ``backward``: the gradient's path as well (the transposed
    reductions of the same sizes, and the sums over the batch positions)."""
    d, hd, t = cfg.d_model, cfg.head_dim, seq_len
    attn = (d + d + int(cfg.qkv_bias) + 2 * hd * int(cfg.head_qk_norm) + hd + (t + TRANSCENDENTAL) + t
            + cfg.n_heads * hd + 1)
    dense_mlp = d + d + TRANSCENDENTAL + cfg.ffn_dim + 1
    per_layer = []
    for i in range(cfg.n_layers):
        if cfg.is_moe_layer(i):
            e, k = cfg.expert_ffn_dim, cfg.top_k + int(cfg.shared_expert)
            mlp = d + (d + TRANSCENDENTAL) + k * (d + TRANSCENDENTAL + e) + k
        else:
            mlp = dense_mlp
        per_layer.append(attn + mlp)
    forward = sum(per_layer) + d + d + (cfg.vocab_size + 2 * TRANSCENDENTAL)
    return 2 * forward + seq_len if backward else forward


def model_rel(cfg, seq_len: int, backward: bool = False, dtype="float32") -> float:
    """How far two float32 orderings of a forward (``backward``: and backward) pass of ``cfg`` can differ, relative
    to the compared tensor's largest entry: twice the random-walk bound over :func:`model_roundings`."""
    return 2.0 * LAMBDA * math.sqrt(model_roundings(cfg, seq_len, backward)) * unit_roundoff(dtype)


def max_rel(a, b) -> float:
    """The largest |a - b| over the largest |b|, across the leaves of two pytrees (or two arrays): the normwise
    relative difference that :func:`model_rel` bounds."""
    import jax

    out = 0.0
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
        scale = float(np.abs(y).max()) if y.size else 0.0
        out = max(out, float(np.abs(x - y).max()) / scale if scale > 0 else float(np.abs(x - y).max()))
    return out


def own_error_tol(low, reference) -> float:
    """For two low-precision (bfloat16) orderings of one computation: :data:`OWN_ERROR_FACTOR` times the normwise
    relative error of ``low`` (one of them) against ``reference`` (the same computation in float32)."""
    return OWN_ERROR_FACTOR * max_rel(low, reference)


def logit_err(h, w, temperature: float = 1.0, dtype="float32"):
    """Per-entry bound on the rounding of logits ``h @ w / temperature`` (h [..., D], w [D, V]): the dot products'
    bound relative to the sums of the absolute values of their terms, plus the division. Returns [..., V]."""
    h, w = np.asarray(h, np.float64), np.asarray(w, np.float64)
    return (sum_rel(h.shape[-1], dtype) + ops(1, dtype)) * (np.abs(h) @ np.abs(w)) / temperature


def logsoftmax_err(z_err, dtype="float32"):
    """Bound on the absolute rounding of a log-softmax's entries (and so of a token's log-prob) whose logits carry
    absolute errors up to ``z_err`` [..., V]: the logit's own error, the log-sum-exp's (a q-weighted mean of the
    logits' errors, at most their largest; the sum of V positive terms; an exp per term, a log) and the
    subtraction. Returns [...] (one bound per row)."""
    z_err = np.asarray(z_err, np.float64)
    V = z_err.shape[-1]
    return 2.0 * z_err.max(-1) + sum_rel(V, dtype) + ops(2, dtype, transcendental=2)


def entropy_err(logq, logq_err, dtype="float32"):
    """Bound on the absolute rounding of the entropy -sum q log q of each row of ``logq`` [..., V] (float64 values)
    whose entries carry absolute errors up to ``logq_err`` [...]: q's relative error is logq's absolute one, so each
    term moves by at most q (|log q| + 1) logq_err, plus the products and the sum of V terms."""
    logq = np.asarray(logq, np.float64)
    q = np.exp(logq)
    terms = np.abs(q * logq).sum(-1)
    V = logq.shape[-1]
    return (np.asarray(logq_err) * (terms + 1.0) + (sum_rel(V, dtype) + ops(1, dtype)) * terms)


def head_reference(h, w, tgt, temperature: float = 1.0, cot_l=None, cot_e=None):
    """Token log-probs under softmax(h @ w / temperature) in float64, with the bounds on float32's rounding of each
    (float32 head math on h and w as given: bfloat16 inputs are exact in float32). With the cotangents ``cot_l``,
    ``cot_e`` of the objective sum(logp * cot_l) + sum(entropy * cot_e): also its value and its gradients with
    respect to h and w, each with its bound. Returns a dict of NumPy arrays (``*_err``: the bounds of one float32
    evaluation against these float64 values)."""
    hf, wf = np.asarray(h, np.float64), np.asarray(w, np.float64)
    z = hf @ wf / temperature
    z -= z.max(-1, keepdims=True)
    logq = z - np.log(np.exp(z).sum(-1, keepdims=True))
    tgt = np.asarray(tgt)
    out = {"logq": logq, "logp": np.take_along_axis(logq, tgt[..., None], -1)[..., 0],
           "ent": -(np.exp(logq) * logq).sum(-1)}
    out["logp_err"] = logsoftmax_err(logit_err(hf, wf, temperature))
    out["ent_err"] = entropy_err(logq, out["logp_err"])
    if cot_l is None:
        return out
    cl, ce = np.asarray(cot_l, np.float64), np.asarray(cot_e, np.float64)
    n = cl.size
    out["value"] = float((cl * out["logp"]).sum() + (ce * out["ent"]).sum())
    out["value_err"] = float((np.abs(cl) * out["logp_err"]).sum() + (np.abs(ce) * out["ent_err"]).sum()
                             + sum_rel(2 * n) * (np.abs(cl * out["logp"]).sum() + np.abs(ce * out["ent"]).sum()))
    # d value / d z = cot_l (onehot - q) - cot_e q (log q + H): each term's relative error is at most logq's
    # absolute one (q = exp(log q)) and the products'; the gradients contract it with w over V, with h over the rows
    q = np.exp(logq)
    V, D = wf.shape[1], wf.shape[0]
    onehot = np.eye(V)[tgt]
    ent = out["ent"][..., None]
    dz = (cl[..., None] * (onehot - q) - ce[..., None] * q * (logq + ent)) / temperature
    dz_abs = (np.abs(cl)[..., None] * (onehot + q) + np.abs(ce)[..., None] * q * (np.abs(logq) + ent + 1.0)) \
        / temperature
    dz_rel = max(out["logp_err"].max(), out["ent_err"].max()) + ops(5)
    out["gh"] = dz @ wf.T
    out["gw"] = hf.reshape(-1, D).T @ dz.reshape(-1, V)
    out["gh_err"] = (dz_rel + sum_rel(V)) * (dz_abs @ np.abs(wf).T)
    out["gw_err"] = (dz_rel + sum_rel(n)) * (np.abs(hf).reshape(-1, D).T @ dz_abs.reshape(-1, V))
    return out


def attention_rel(keys: int, head_dim: int, backward: bool = False, dtype="float32") -> float:
    """How far two float32 orderings of softmax attention over ``keys`` positions can differ, relative to the
    compared tensor's largest entry: the random-walk bound over the scores' dot products (head_dim), the softmax's
    sum and exp, and the weighted sum of the values (keys); ``backward``: the gradients' contractions as well (over
    head_dim for dp, over the keys twice for the softmax's backward and the contraction into dq / dk)."""
    n = head_dim + (keys + TRANSCENDENTAL) + keys
    if backward:
        n += head_dim + 2 * keys
    return 2.0 * LAMBDA * math.sqrt(n) * unit_roundoff(dtype)


def check_train_steps(cfg, params, batch, ref, other, *, lr: float, temperature: float = 1.0,
                      eps_max: float = 5.0) -> None:
    """Assert that two float32 implementations of one RL train step agree to rounding. ``ref`` and ``other`` are
    ``([loss, entropy, grad_norm], [parameter deltas])`` of the first step from ``params`` with an optimiser whose
    first update is -lr g / (|g| + 1) (adam_eps=1, no weight decay).

    The gradients (and the grad norm) may differ by :func:`model_rel` of their scale; the loss and the entropy by
    that of the sums of their terms' absolute values (the loss's: :func:`rl_loss_scale`; the entropy's: the entropy
    itself, at most log V). An update moves by at most lr times its gradient's difference, and is resolved to the
    float32 spacing of the parameter it was added to (each side rounds p + update once: at most half a spacing of
    the larger binade)."""
    import jax

    (m_r, d_r), (m_o, d_o) = ref, other
    rel = model_rel(cfg, np.asarray(batch["tokens"]).shape[1], backward=True)
    loss_scale, _ = rl_loss_scale(cfg, params, batch, temperature, eps_max)
    scales = (loss_scale, math.log(cfg.vocab_size), m_r[2])
    for name, a, b, scale in zip(("loss", "entropy", "grad_norm"), m_o, m_r, scales, strict=True):
        assert abs(a - b) <= rel * scale, (name, a, b, rel * scale)
    for a, b, p in zip(d_o, d_r, jax.tree.leaves(params), strict=True):
        ulp = float(np.spacing(np.float32(np.abs(p).max() + np.abs(b).max())))
        assert np.abs(a - b).max() <= lr * rel * m_r[2] + 2 * ulp, (np.abs(a - b).max(), lr * rel * m_r[2], ulp)


def rl_loss_scale(cfg, params, batch, temperature: float = 1.0, eps_max: float = 5.0) -> tuple[float, float]:
    """(a bound on the sum of the absolute values of the RL loss's weighted token terms, the largest |log p| of a
    trained token) for the model ``cfg`` with ``params`` on ``batch``, from the model's own log-probs: the
    aggregation's weights sum to one, so the largest term bounds the sum."""
    import jax.numpy as jnp

    from scalerl_jax.models import forward

    logits = np.asarray(forward(params, jnp.asarray(batch["tokens"]), cfg), np.float64)[:, :-1] / temperature
    z = logits - logits.max(-1, keepdims=True)
    logq = z - np.log(np.exp(z).sum(-1, keepdims=True))
    logp = np.take_along_axis(logq, np.asarray(batch["tokens"])[:, 1:, None], -1)[..., 0]
    used = np.asarray(batch["loss_mask"])[:, 1:] > 0
    rho = np.exp(np.clip(logp - np.asarray(batch["gen_logp"], np.float64)[:, 1:], -50.0, 50.0))
    adv = np.abs(np.asarray(batch["advantages"], np.float64))[:, None]
    # CISPO: min(rho, eps_max) |A| |log p|; DAPO / GRPO / GSPO: a (clipped) ratio times |A|, the clip at most 1.28
    terms = np.maximum(np.minimum(rho, eps_max) * np.abs(logp), np.maximum(rho, 1.28)) * adv
    logp_max = float(np.abs(logp[used]).max()) if used.any() else 0.0
    return float(terms[used].max()) if used.any() else 0.0, logp_max


def train_steps_tol(cfg, params, batch, ref_metrics, ref_logits=None, *, lr: float, steps: int = 1,
                    temperature: float = 1.0) -> dict:
    """Bounds for ``steps`` train steps of another float32 ordering (a sharded mesh, a kernel) against the reference
    steps from ``params`` (optimiser as in :func:`check_train_steps`), for the multi-device check scripts:
    ``forward`` (the logits' largest absolute difference), ``loss`` (absolute, the last step's), ``grad_norm_rel``
    (the first step's, relative) and ``params`` (the largest absolute difference after the steps: each step's update
    moves by at most lr x the gradient's difference, which is at most ``model_rel`` x the grad norm, plus the
    parameter's float32 spacing; the loss of a later step adds what those moved parameters change, to first order
    as much again)."""
    import jax

    rel_b = model_rel(cfg, np.asarray(batch["tokens"]).shape[1], backward=True)
    loss_scale, _ = rl_loss_scale(cfg, params, batch, temperature)
    spacing = max(float(np.spacing(np.float32(np.abs(np.asarray(p)).max()))) for p in jax.tree.leaves(params))
    out = {"loss": steps * rel_b * loss_scale, "grad_norm_rel": rel_b,
           "params": steps * (lr * rel_b * float(ref_metrics["grad_norm"]) + 2 * spacing)}
    if ref_logits is not None:
        out["forward"] = model_rel(cfg, np.asarray(batch["tokens"]).shape[1]) * float(np.abs(ref_logits).max())
    return out


def moe_layer_rel(cfg, n_tokens: int, backward: bool = False, dtype="float32") -> float:
    """How far two float32 orderings of one MoE layer (``cfg``'s router, its top-k experts' and, where there is one
    (Llama 4), the shared expert's SwiGLU MLPs, their weighted combination) over ``n_tokens`` tokens can differ,
    relative to the compared tensor's largest entry; ``backward``: the gradients too (the transposed reductions, and
    the sums over the tokens into the weights' gradients)."""
    d, e, k = cfg.d_model, cfg.expert_ffn_dim, cfg.top_k + int(cfg.shared_expert)
    n = d + (d + TRANSCENDENTAL) + k * (d + TRANSCENDENTAL + e) + k
    if backward:
        n = 2 * n + n_tokens
    return 2.0 * LAMBDA * math.sqrt(n) * unit_roundoff(dtype)


def model_logprob_tol(cfg, seq_len: int, logits_max: float) -> float:
    """How far two float32 orderings of a model's token log-probs (a KV-cached decode and a full forward pass, say)
    can differ: a log-prob is a logit minus the log-sum-exp of the row, so it moves by at most twice the logits'
    bound (:func:`model_rel` of the largest logit, ``logits_max``), plus the log-sum-exp's own sum over the vocabulary
    (in another order) and its exp and log."""
    return (2.0 * model_rel(cfg, seq_len) * logits_max + reorder_rel(cfg.vocab_size)
            + 2 * ops(0, transcendental=2))


def max_logit(params, cfg, tokens) -> float:
    """The largest |logit| of the model ``cfg`` with ``params`` over ``tokens`` ([T] or [B, T], padded with token 0
    to ``cfg.max_seq_len``: one compile per model): the scale of :func:`model_logprob_tol`."""
    import jax
    import jax.numpy as jnp

    t = np.asarray(tokens, np.int32).reshape(-1, np.shape(tokens)[-1])
    if t.shape[1] < cfg.max_seq_len:
        t = np.pad(t, ((0, 0), (0, cfg.max_seq_len - t.shape[1])))
    return float(np.abs(np.asarray(_forward_jit()(jax.tree.map(jnp.asarray, params), jnp.asarray(t), cfg))).max())


def _forward_jit():
    global _FORWARD
    if _FORWARD is None:
        import jax

        from scalerl_jax.models import forward

        _FORWARD = jax.jit(forward, static_argnums=2)
    return _FORWARD


_FORWARD = None
