"""scalerl_jax/rollout/client/remote.py without servers: reseeding goes through the client's public reseed, device
counts (given, the fleet's, the client's), and the metrics' names. The weight push over
real servers is covered by test_sglang_client.py and test_fleet.py."""

from __future__ import annotations

import numpy as np
import pytest

from scalerl_jax.models import tiny
from scalerl_jax.rollout.client import RemoteGenerator, SGLangGenerator
from scalerl_jax.rollout.length_rule import draw_budget
from scalerl_jax.rollout.protocol import LengthControl

DEAD = "http://127.0.0.1:9"  # nothing listens on the discard port: the few calls made fail at once


@pytest.fixture
def client():
    gen = SGLangGenerator([DEAD, DEAD + "/"], max_retries=0, dead_cooldown_s=0.0)
    yield gen
    gen.close()


def test_reseed_reaches_the_clients_budget_draws(client, tmp_path):
    remote = RemoteGenerator(client, tiny(), export_dir=tmp_path / "w", tokenizer_dir=tmp_path)
    lc = LengthControl(think_end_ids=(1,), interruption_ids=(2,), budget_lo=1, budget_hi=10**6, answer_budget=0)
    remote.reseed(11)
    first = [draw_budget(client._rng, lc) for _ in range(4)]
    remote.reseed(11)
    again = [draw_budget(client._rng, lc) for _ in range(4)]
    ref = np.random.default_rng(11)
    assert first == again == [draw_budget(ref, lc) for _ in range(4)]


class _Fleet:
    def __init__(self, n):
        self.n, self.worker_urls = n, ["http://a:1"]

    def device_count(self):
        return self.n


def test_device_count_order(client, tmp_path):
    kw = {"export_dir": tmp_path / "w", "tokenizer_dir": tmp_path}
    assert RemoteGenerator(client, tiny(), devices=5, fleet=_Fleet(3), **kw).device_count() == 5  # given
    assert RemoteGenerator(client, tiny(), fleet=_Fleet(3), **kw).device_count() == 3  # the fleet's
    # the client's: each server's /get_server_info; unreachable servers count as one device each
    assert RemoteGenerator(client, tiny(), **kw).device_count() == client.device_count()
    with pytest.raises(ValueError, match="keep must be >= 1"):
        RemoteGenerator(client, tiny(), keep=0, **kw)


def test_metrics_names(client, tmp_path):
    client.stats["retries"] = 2
    remote = RemoteGenerator(client, tiny(), export_dir=tmp_path / "w", tokenizer_dir=tmp_path)
    m = remote.metrics()
    assert m["client_retries"] == 2 and m["weight_pushes"] == 0 and m["weight_sync_seconds"] == 0.0
    client._begin(DEAD)
    client._end(DEAD, 7, False)
    assert remote.metrics()["server_127.0.0.1:9_tokens"] == 7  # per-server counters, URL without the scheme

