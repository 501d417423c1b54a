"""One process of a two-process restore (run by tests/test_state_init.py through ``scalerl_jax.launch``).

Both processes build a TrainerCore on one mesh over their 4 devices and save checkpoints 1 and 2. Then process 1
alone fails to read some of them (an injected I/O error in its own read of the files): ``newest`` fails step 2 there,
``all`` fails both. Every process prints one RESULT line: the step it restored, or the ResumeError it stopped with.
"""

import json
import sys
from pathlib import Path

from scalerl_jax import distributed as dist

dist.initialize(dist.resolve(), log=lambda s: None)

import dataclasses  # noqa: E402

import jax  # noqa: E402
import numpy as np  # noqa: E402

from scalerl_jax.checkpoint import ResumeError, RunCheckpointer  # noqa: E402
from scalerl_jax.config import ExperimentConfig, MeshConfig, RolloutConfig  # noqa: E402
from scalerl_jax.models import init_params, tiny  # noqa: E402
from scalerl_jax.train.core import TrainerCore  # noqa: E402

run, mode = Path(sys.argv[1]), sys.argv[2]
cfg = dataclasses.replace(tiny(), n_layers=2, vocab_size=24)
exp = ExperimentConfig(model=cfg, mesh=MeshConfig(fsdp=4), out_dir=str(run),
                       rollout=RolloutConfig(prompts_per_batch=4, group_size=2, max_prompt_len=8, max_new_tokens=8))
params = jax.tree.map(np.asarray, init_params(cfg, jax.random.key(0)))
core = TrainerCore(exp, params, seq_len=16, pad_id=0, run_dir=run, log=lambda s: None)
for step in (1, 2):
    core.save(step, {"step": step})
    core.wait()
core.close()

fail = {"newest": {2}, "all": {1, 2}}[mode]
if jax.process_index() == 1:  # this process cannot read those checkpoints' files (a node's mount, permissions)
    real = RunCheckpointer.preflight

    def preflight(self, step):
        if step in fail:
            raise OSError(f"injected read error of step {step} on process 1")
        return real(self, step)

    RunCheckpointer.preflight = preflight
try:
    resumed = TrainerCore(exp, "/base-weights-not-needed", seq_len=16, pad_id=0, run_dir=run, log=lambda s: None,
                          resume=True)
    out = {"restored": resumed.restored[0]}
    resumed.close()
except ResumeError as e:
    out = {"error": str(e)}
print("RESULT " + json.dumps({"process": jax.process_index(), **out}), flush=True)
