"""The names both sides of the SGLang API agree on, written once: our server (:mod:`.server.app`,
:mod:`.server.wire`), the client (:mod:`.client.sglang`, :mod:`.client.wire`, :mod:`.client.weights`) and the
local fleet (:mod:`.fleet.local`) import them from here.

- routes: SGLang's native routes we serve or call, and ours (``/stats``);
- ``/pause_generation`` modes (:data:`PAUSE_MODES`);
- our extension fields (:data:`EXTENSIONS`): the request's ``length_control`` object (:data:`LENGTH_FIELDS`) and the
  response's ``meta_info`` fields (:data:`META_EXTENSIONS`); a server lists them under :data:`EXTENSIONS_KEY`
  in ``/get_model_info`` and ``/get_server_info``;
- the rule for the accelerator devices a server computes on (:func:`devices_from_server_info`).
"""

from __future__ import annotations

from typing import Any

# ---- routes --------------------------------------------------------------------------------------------------
GENERATE = "/generate"
UPDATE_WEIGHTS = "/update_weights_from_disk"
PAUSE = "/pause_generation"
CONTINUE = "/continue_generation"
FLUSH_CACHE = "/flush_cache"
ABORT = "/abort_request"
WEIGHT_VERSION = "/get_weight_version"
HEALTH = "/health"
HEALTH_GENERATE = "/health_generate"
LOAD = "/get_load"
MODEL_INFO = "/get_model_info"  # also served as /model_info
MODEL_INFO_ALIAS = "/model_info"
SERVER_INFO = "/get_server_info"  # also served as /server_info (newer SGLang's name)
SERVER_INFO_ALIAS = "/server_info"
STATS = "/stats"  # ours: request and scheduler counters
ROUTER_WORKERS = ("/workers", "/list_workers")  # sglang-router's worker list (newer, older)

# ---- /pause_generation ---------------------------------------------------------------------------------------
#: modes of ``/pause_generation {"mode"}`` (SGLang 0.5.6+): keep requests in place, retract them (recompute their
#: KV caches on continue) or abort them; a body without ``mode`` aborts
PAUSE_MODES = ("in_place", "retract", "abort")
PAUSE_DEFAULT = "abort"

# ---- our extension fields ------------------------------------------------------------------------------------
LENGTH_CONTROL = "length_control"  # request field: interruption length control
#: the fields of ``length_control`` (:class:`~scalerl_jax.rollout.protocol.LengthControl`'s)
LENGTH_FIELDS = ("think_end_ids", "interruption_ids", "budget_lo", "budget_hi", "answer_budget")
OUTPUT_TOKEN_VERSIONS = "output_token_versions"  # meta_info: policy version per output token (-1: injected)
OUTPUT_TOKEN_INJECTED = "output_token_injected"  # meta_info: bools
THINK_BUDGET = "think_budget"  # meta_info: the thinking budget drawn (int or null)
TRUNCATED = "truncated"  # meta_info: bool
FINISH_REASON = "scalerl_finish_reason"  # meta_info: "stop" | "length" | "interrupted" | "abort"
META_EXTENSIONS = (OUTPUT_TOKEN_VERSIONS, OUTPUT_TOKEN_INJECTED, THINK_BUDGET, TRUNCATED, FINISH_REASON)
EXTENSIONS = [LENGTH_CONTROL, *META_EXTENSIONS]
EXTENSIONS_KEY = "scalerl_extensions"  # /get_model_info and /get_server_info list EXTENSIONS under this key
SERVER_VERSION = "scalerl_jax"  # the "version" our server reports in /get_server_info
DEVICE_COUNT = "device_count"  # /get_server_info: the accelerator devices our server's engine computes on


def devices_from_server_info(info: Any) -> int | None:
    """Accelerator devices a server computes on, from its ``/get_server_info``: ours reports :data:`DEVICE_COUNT`;
    real SGLang's ``ServerArgs`` give ``tp_size * pp_size * dp_size`` (with DP attention the DP ranks live inside
    the TP group). None when ``info`` says neither."""
    if not isinstance(info, dict):
        return None
    v = info.get(DEVICE_COUNT)
    if isinstance(v, int) and not isinstance(v, bool) and v > 0:
        return v
    tp, pp, dp = (info.get(k) for k in ("tp_size", "pp_size", "dp_size"))
    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
        return None
    n = tp * (pp if isinstance(pp, int) and not isinstance(pp, bool) and pp > 0 else 1)
    if isinstance(dp, int) and not isinstance(dp, bool) and dp > 1 and not info.get("enable_dp_attention"):
        n *= dp
    return n
