"""A stand-in trainer process for the launcher test: says it is ready with its rank, then sleeps."""

import os
import time

print(f"ready: process {os.environ['JAX_PROCESS_ID']} of {os.environ['JAX_NUM_PROCESSES']}", flush=True)
time.sleep(120)
