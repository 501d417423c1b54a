"""No-Positive-Resampling: pass-rate history over epochs, removal at >= 0.9, exact save/restore."""

from __future__ import annotations

import json

import numpy as np
import pytest

from scalerl_jax.data.curriculum import NPRCurriculum


def test_hand_worked_history():
    cur = NPRCurriculum()
    # Epoch 1: prompt 1 gets 7/8 = 0.875 < 0.9 -> active; prompt 2 gets 9/10 = 0.9 -> removed (>= is inclusive).
    assert cur.update(1, 7, 8) is False
    assert cur.update(2, 9, 10) is True
    assert cur.is_active(1) and not cur.is_active(2)
    # Epoch 2: prompt 1 gets 8/8 -> history 15/16 = 0.9375 -> removed; prompt 3 gets 0/8.
    assert cur.update(1, 8, 8) is True
    cur.update(3, 0, 8)
    assert cur.pass_rate(1) == 15 / 16 and cur.pass_rate(3) == 0.0 and cur.pass_rate(99) is None
    assert cur.removed == {1, 2}
    assert cur.filter([3, 1, 4, 2, 0]) == [3, 4, 0]
    assert cur.stats() == {"n_tracked": 3, "n_removed": 2}
    # Removal is permanent: a later bad result does not bring prompt 2 back (history 9/20 = 0.45).
    assert cur.update(2, 0, 10) is False
    assert not cur.is_active(2)


def test_disabled_tracks_but_never_removes():
    cur = NPRCurriculum(enabled=False)
    cur.update(5, 8, 8)
    assert cur.is_active(5) and cur.filter([5]) == [5] and cur.stats() == {"n_tracked": 1, "n_removed": 0}


def test_bad_updates_rejected():
    cur = NPRCurriculum()
    with pytest.raises(ValueError):
        cur.update(0, 3, 2)
    with pytest.raises(ValueError):
        cur.update(0, -1, 2)
    with pytest.raises(ValueError):
        NPRCurriculum(threshold=0.0)


def _run_epochs(cur, n_epochs, solve_p, rng, log, group=8, save_restore_after=None):
    """A minimal epoch loop: the schedule of each epoch is built once, at its start, from cur.filter."""
    all_prompts = list(range(len(solve_p)))
    for epoch in range(n_epochs):
        if save_restore_after is not None and epoch == save_restore_after:
            cur = NPRCurriculum.from_state_dict(json.loads(json.dumps(cur.state_dict())))
        schedule = cur.filter(rng.permutation(all_prompts).tolist())
        log.append(("schedule", epoch, schedule))
        for pid in schedule:
            n_correct = int((rng.random(group) < solve_p[pid]).sum())
            if cur.update(pid, n_correct, group):
                log.append(("removed", epoch, pid))
    return cur


def test_removed_prompts_never_sampled_again_across_epochs_and_restore():
    solve_p = np.linspace(0.0, 1.0, 40)
    log_a, log_b = [], []
    cur_a = _run_epochs(NPRCurriculum(), 6, solve_p, np.random.default_rng(0), log_a)
    cur_b = _run_epochs(NPRCurriculum(), 6, solve_p, np.random.default_rng(0), log_b, save_restore_after=3)
    # Save/restore (through JSON) mid-run changes nothing: identical schedules, removals and final state.
    assert log_a == log_b and cur_a == cur_b
    removed_at = {pid: epoch for kind, epoch, pid in log_a if kind == "removed"}
    assert len(removed_at) > 5  # the easy prompts do cross 0.9
    for kind, epoch, schedule in log_a:
        if kind != "schedule":
            continue
        for pid, e_removed in removed_at.items():
            # Removed during epoch e: it was in epoch e's schedule (and finished it), and is in no later one.
            if epoch == e_removed:
                assert pid in schedule
            if epoch > e_removed:
                assert pid not in schedule
    # Every removed prompt has a historical pass rate >= 0.9, and no active tracked prompt does.
    for pid in range(len(solve_p)):
        rate = cur_a.pass_rate(pid)
        assert (pid in cur_a.removed) == (rate is not None and rate >= 0.9)


def test_state_dict_roundtrip_exact():
    cur = NPRCurriculum(threshold=0.75)
    for pid, (c, t) in enumerate([(3, 4), (1, 4), (4, 4), (0, 0)]):
        cur.update(pid * 1000, c, t)
    state = cur.state_dict()
    text = json.dumps(state)
    restored = NPRCurriculum.from_state_dict(json.loads(text))
    assert restored == cur and restored.state_dict() == state
    assert restored.removed == {0, 2000} and restored.threshold == 0.75
    other = NPRCurriculum()
    other.load_state_dict(json.loads(text))
    assert other == cur and other.pass_rate(1000) == 0.25
