"""ScaleRL on math: the tiny CPU default end to end, and the real 8B preset.

Launch::

    python -m experiments.math_8b --preset tiny                  # CPU default: warm start, RL, fit, report
    python -m experiments.math_8b --preset tiny --seed 1 --out runs/tiny_s1
    python -m experiments.math_8b --preset tiny --resume --out runs/tiny   # continue a killed run
    python -m experiments.math_8b --preset tiny --variant no_npr           # a leave-one-out variant
    python -m experiments.math_8b --preset 8b --dry-run                    # validate + AOT-compile the 8B step
    python -m experiments.math_8b --preset 8b --model /ckpt/llama3.1-8b --data polaris.jsonl \\
        --sglang-urls http://gen0:30000 http://gen1:30000               # on accelerators
    python -m experiments.math_8b --preset tiny --train.lr 2e-4 --rollout.k 4           # any config field
    python -m experiments.math_8b --preset tiny --set train.lr=2e-4 --set data.npr=false  # the same, as --set
    python -m scalerl_jax.launch --processes 2 --cpu-devices 2 -- experiments.math_8b --preset smoke  # 2 processes

Several trainer processes (one global mesh, process 0 generating, scoring and writing; BUILD.md "Multi-host"):
every process runs the same command with ``--coordinator HOST:PORT --num-processes P --process-id I``, or with
``JAX_COORDINATOR_ADDRESS`` / ``JAX_NUM_PROCESSES`` / ``JAX_PROCESS_ID`` set, or as the tasks of an ``srun`` step.

The tiny preset (DESIGN.md "The tiny default"): a ~1M-parameter (0.99M) Llama over a 17-character vocabulary is
warm-started on the synthetic task ``a+b*c=`` (completion ``b*c=X;a+X=Y#Y``), then trained with every ScaleRL
component on: PipelineRL-8, CISPO (eps_max 5), FP32 LM head, prompt-level aggregation, batch advantage
normalisation, zero-variance filtering, No-Positive-Resampling and interruption length control (thinking marker
``#``, budget U[20, 26] tokens, answer budget 5). Evaluation rows go to metrics.jsonl; at the end the sigmoid law
is fitted on the first half of the run's compute and compared with what the second half reached (report.md).
"""

from __future__ import annotations

import sys

from scalerl_jax.experiments.cli import run_command


def main(argv: list[str] | None = None, *, presets: dict | None = None) -> int:
    """The command line (``--help``: every flag; :mod:`experiments.cli`); ``presets`` replaces the preset table;
    returns the exit status."""
    return run_command(argv, presets=presets, real_preset="8b", cpu_preset="tiny", prog="python -m experiments.math_8b",
                       doc=__doc__)


if __name__ == "__main__":
    sys.exit(main())
