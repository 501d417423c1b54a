"""The Pallas kernels under a device mesh: each runs on its own devices' rows (inside shard_map, since GSPMD cannot
split a pallas_call) and the sharded train step equals the unsharded reference step (4 simulated CPU devices, kernels in
interpret mode: named outside the tests/test_kernel_*.py pattern that benchmarks/gpu_check.sh compiles on a GPU)."""

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.extended  # the Pallas kernels in interpret mode (CPU stand-ins for GPU code): CI runs them
@pytest.mark.background("sharded_kernels", ["tests/_sharded_kernels_check.py"])
def test_kernels_under_a_mesh_match_the_unsharded_reference(background):
    r = background["sharded_kernels"]
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(r.stdout.strip().splitlines()[-1])
    assert set(res) == {"kv2_fsdp2xtensor2", "kv2_fsdp4xtensor1", "kv1_fsdp2xtensor2"}
    for case, v in res.items():
        # the attention kernel (forward, dK/dV, dQ) in the jitted train step: each inside a shard_map, none left
        # for GSPMD to replicate
        assert v["pallas_calls"]["outside"] == 0 and v["pallas_calls"]["inside"] >= 3, v
        assert abs(v["loss_ref"]) > 1e-2 and v["update"] > 1e-4, (case, v)  # a real loss, a real step
        # what reordering the float32 work across the mesh and into the kernels can change (tests/tolerances.py)
        for key in ("loss", "grad_norm_rel", "params"):
            assert v[key] <= v["tol"][key], (case, key, v)
