"""A stand-in trainer process for the launcher tests: prints the rank and device variables it was given as JSON."""

import json
import os

KEYS = ("JAX_PROCESS_ID", "JAX_NUM_PROCESSES", "JAX_COORDINATOR_ADDRESS", "CUDA_VISIBLE_DEVICES",
        "SCALERL_LOCAL_DEVICE_IDS", "JAX_PLATFORMS", "XLA_FLAGS")
print("ENV " + json.dumps({k: os.environ.get(k) for k in KEYS}), flush=True)
