from scalerl_jax.hostmem import reexec_for_cli

# `python -m experiments.module` restarts once with huge pages for XLA's CPU buffers (scalerl_jax/hostmem.py)
reexec_for_cli()
