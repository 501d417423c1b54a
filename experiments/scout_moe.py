"""ScaleRL on the MoE: Llama-4-Scout-17B-16E (the paper's second model) and a tiny CPU MoE that runs end to end.

Launch::

    python -m experiments.scout_moe --preset tiny_moe            # CPU: warm start, RL, fit, report
    python -m experiments.scout_moe --preset scout --dry-run     # validate + AOT-compile the Scout step (16 devices)
    python -m experiments.scout_moe --preset scout --model /ckpt/Llama-4-Scout-17B-16E --data polaris.jsonl \\
        --sglang-urls http://gen0:30000                          # on accelerators

``tiny_moe`` is the tiny default (same task, recipe, budgets and length control as ``math_8b --preset tiny``)
with the model swapped for a Llama-4-style MoE: 4 routed experts (top-1, sigmoid scores) + a shared expert on
layers 1 and 3, dense SwiGLU on 0 and 2, one NoPE layer with temperature tuning, chunked attention and QK norm on
the RoPE layers. Train rows carry the router statistics (``router_load_e*``, ``router_load_max``,
``router_dropped_frac``, and ``moe_aux_loss``, the load-balancing loss that ``--set loss.moe_aux_coef=0.001`` adds
to the loss; 0 by default). ``scout`` is RECIPE.md's recipe on Scout shapes with 16 trainer devices whose expert
axis spans all 16 (expert parallelism: shard_map + all_to_all + ragged_dot; capacity factor 2).

Every flag of ``experiments.math_8b`` works here (``--variant``, ``--resume``, ``--seed``, every config field such as
``--model.moe-capacity-factor 2`` or ``--set model.moe_capacity_factor=2``, ...); ``--help`` lists them.
"""

from __future__ import annotations

import sys

from scalerl_jax.experiments.cli import run_command
from scalerl_jax.experiments.presets import MOE_PRESETS


def main(argv: list[str] | None = None) -> int:
    """The command line (``--help``); returns the exit status."""
    return run_command(argv, presets=MOE_PRESETS, real_preset="scout", cpu_preset="tiny_moe",
                       prog="python -m experiments.scout_moe", doc=__doc__)


if __name__ == "__main__":
    sys.exit(main())
