"""One process of a multi-process per-shard load (run by tests/test_state_init.py through ``scalerl_jax.launch``).

Every process loads the same HF checkpoint onto a mesh over all processes' devices with ``load_hf_sharded``, checks
that each block its own devices hold equals the same block of the whole-model load bit for bit, and prints one JSON
line: its process index, the bytes it read and the tensors' bytes on disk.
"""

import json
import sys
from pathlib import Path

import jax

from scalerl_jax import distributed as dist

dist.initialize(dist.resolve())

import numpy as np  # noqa: E402

from scalerl_jax import sharding as shd  # noqa: E402
from scalerl_jax.config import MeshConfig, TrainConfig  # noqa: E402
from scalerl_jax.models import load_hf_checkpoint  # noqa: E402
from scalerl_jax.models.hf_io import read_hf_config  # noqa: E402
from scalerl_jax.models.hf_sharded import ReadStats, load_hf_sharded  # noqa: E402
from scalerl_jax.train import make_optimizer, state_shardings  # noqa: E402

ckpt = Path(sys.argv[1])
_, cfg = read_hf_config(ckpt)
mesh = shd.make_mesh(MeshConfig(fsdp=jax.device_count()))
_, st_sh = state_shardings(cfg, make_optimizer(TrainConfig()), mesh)
stats = ReadStats()
params = load_hf_sharded(ckpt, cfg, st_sh.params, stats=stats)
whole, _ = load_hf_checkpoint(ckpt)
equal = all(np.array_equal(np.asarray(s.data), np.asarray(w)[s.index])
            for a, w in zip(jax.tree.leaves(params), jax.tree.leaves(whole), strict=True) for s in a.addressable_shards)
disk = sum(np.asarray(w).nbytes for w in jax.tree.leaves(whole))
print("RESULT " + json.dumps({"process": jax.process_index(), "equal": bool(equal), "bytes_read": stats.bytes_read,
                              "bytes_on_disk": int(disk), "local_devices": jax.local_device_count()}), flush=True)
