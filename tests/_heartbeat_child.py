"""A stand-in trainer process for the launcher's heartbeat diagnosis (no JAX): every rank logs the start-up
timeouts line and says it is ready; rank ``argv[1]`` then ends as JAX ends a process whose coordination service
found processes silent (the service's message, then SIGABRT), the others sleep."""

import os
import sys
import time

rank = int(os.environ["JAX_PROCESS_ID"])
print("[dist] timeouts: start-up 300s (--dist-timeout); heartbeat 12s (--heartbeat-timeout: ...)", flush=True)
print(f"ready: process {rank}", flush=True)
if rank == int(sys.argv[1]):
    time.sleep(1.0)
    # JAX's lines when the coordination service declares processes 1 and 0 silent (as jaxlib 0.10 writes them)
    print("F1203 client.h:80] Terminating process because the JAX distributed service detected fatal errors. This "
          "most likely indicates that another task died; see the other task logs for more details. absl::Status: "
          "UNAVAILABLE: The following tasks are unhealthy (stopped sending heartbeats):\n1\n0\nThe tasks have "
          "crashed. Check the task logs for an earlier error", flush=True)
    os.abort()
time.sleep(60)
