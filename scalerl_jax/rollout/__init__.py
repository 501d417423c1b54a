"""Generation for the RL loop, one concern per folder: ``engine/`` (the embedded JAX engine and its driver thread),
``server/`` (our SGLang-API HTTP server), ``client/`` (the SGLang client and the weight push to a fleet) and
``fleet/`` (local servers behind ``sglang-router``). Shared by all of them at the top: ``protocol.py`` (the
Generator protocol), ``wire_schema.py`` (the names both sides of the SGLang API use), ``length_rule.py`` (the
interruption rule the engine and the client both apply) and ``orchestrator.py`` (PipelineRL-k / PPO-off-policy-k).
"""
