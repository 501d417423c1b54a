"""Run as a script (in its own process, with its own XLA_FLAGS device count): restore a run directory's newest
checkpoint onto a mesh of this process's devices, with the run's own config, and write its parameters to an npz
file; prints ``step n_devices sha256`` of the parameter bytes. The restore itself checks every leaf against the
checksums the saving processes recorded in the side car."""

import hashlib
import json
import sys

import jax
import numpy as np

from scalerl_jax import sharding as shd
from scalerl_jax.checkpoint import RunCheckpointer
from scalerl_jax.config import ExperimentConfig, from_dict
from scalerl_jax.train.optim import make_optimizer
from scalerl_jax.train.step import state_shardings


def main(run: str, out: str) -> None:
    cfg = json.load(open(f"{run}/config.json"))
    for key in ("base_model", "sandbox_active", "max_prompt_len_asked"):  # what the run adds to its config
        cfg.pop(key, None)
    exp = from_dict(ExperimentConfig, cfg)
    abstract, shardings = state_shardings(exp.model, make_optimizer(exp.train), shd.make_mesh(exp.mesh))
    target = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract, shardings)
    restored = RunCheckpointer(f"{run}/checkpoints").restore_latest(target)
    assert restored is not None, f"no checkpoint in {run} restored"
    step, state, _ = restored
    flat = {jax.tree_util.keystr(k): np.asarray(v)
            for k, v in jax.tree_util.tree_leaves_with_path(jax.device_get(state.params))}
    np.savez(out, **flat)
    digest = hashlib.sha256(b"".join(flat[k].tobytes() for k in sorted(flat))).hexdigest()
    print(step, len(jax.devices()), digest)


if __name__ == "__main__":
    main(*sys.argv[1:3])
