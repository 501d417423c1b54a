"""A local generation fleet: :class:`LocalFleet` (``local.py``) starts N ``python -m scalerl_jax.serve`` processes
behind a real ``sglang-router``, restarts the ones that die and always stops them again; ``processes.py`` holds
the child-process plumbing (spawning in process groups, signal and atexit hooks, free ports, log tails), and
``guard.py`` the small process that kills the router once the experiment is gone
(``python -m scalerl_jax.rollout.fleet.guard``).
"""

from scalerl_jax.rollout.fleet.local import FleetError, LocalFleet

__all__ = ["FleetError", "LocalFleet"]
