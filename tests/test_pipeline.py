"""Training prompt pipeline: deterministic per-epoch shuffles, exact resume, curriculum removal, validation."""

import json

import pytest

from scalerl_jax.data import (
    AllPromptsRemovedError,
    PromptIterator,
    arith_problems,
    build_prompt_data,
    split_problems,
)
from scalerl_jax.data.tasks import Problem
from tests.conftest import DATA


class StandInCurriculum:
    """Minimal No-Positive-Resampling stand-in: a prompt is removed once its pass rate reaches the threshold."""

    def __init__(self, threshold=0.9):
        self.threshold = threshold
        self.stats = {}

    def update(self, prompt_id, n_correct, n_total):
        c, t = self.stats.get(prompt_id, (0, 0))
        self.stats[prompt_id] = (c + n_correct, t + n_total)

    def is_active(self, prompt_id):
        c, t = self.stats.get(prompt_id, (0, 0))
        return t == 0 or c / t < self.threshold

    def filter(self, prompt_ids):
        return [i for i in prompt_ids if self.is_active(i)]

    def state_dict(self):
        return {"stats": {str(k): list(v) for k, v in self.stats.items()}, "threshold": self.threshold}

    @classmethod
    def from_state_dict(cls, d):
        c = cls(d["threshold"])
        c.stats = {int(k): tuple(v) for k, v in d["stats"].items()}
        return c


def _problems(n=20):
    return [Problem(prompt_id=100 + i, prompt=f"p{i}", answer=str(i), solution=str(i), source="t") for i in range(n)]


def _ids(batch):
    return [p.prompt_id for p in batch]


def test_deterministic_and_epochs_are_permutations():
    probs = _problems(20)
    all_ids = sorted(p.prompt_id for p in probs)
    a = _ids(PromptIterator(probs, seed=7).next_batch(60))
    assert a == _ids(PromptIterator(probs, seed=7).next_batch(60))
    assert a != _ids(PromptIterator(probs, seed=8).next_batch(60))
    epochs = [a[0:20], a[20:40], a[40:60]]
    for e in epochs:
        assert sorted(e) == all_ids
    assert epochs[0] != epochs[1] and epochs[1] != epochs[2]
    assert epochs[0] != all_ids  # actually shuffled


@pytest.mark.parametrize("cut", [0, 1, 13, 20, 27, 40])
def test_resume_continues_identically(cut):
    probs = _problems(20)
    ref = PromptIterator(probs, seed=3)
    expected = _ids(ref.next_batch(70))
    it = PromptIterator(probs, seed=3)
    it.next_batch(cut)
    state = json.loads(json.dumps(it.get_state()))
    it2 = PromptIterator(probs, seed=3)
    it2.set_state(state)
    assert _ids(it2.next_batch(70 - cut)) == expected[cut:]


def test_curriculum_removal_and_resume():
    probs = _problems(20)
    cur = StandInCurriculum()
    it = PromptIterator(probs, seed=1, curriculum=cur)
    first = it.next_batch(10)
    removed = {p.prompt_id for p in first[:4]}
    for p in first:  # four prompts solved every time, the rest never
        cur.update(p.prompt_id, 8 if p.prompt_id in removed else 0, 8)
    rest_of_epoch0 = it.next_batch(10)
    assert sorted(_ids(first + rest_of_epoch0)) == sorted(p.prompt_id for p in probs)  # current epoch untouched
    # checkpoint here (end of epoch 0), together with the curriculum
    state = json.loads(json.dumps(it.get_state()))
    cur_state = json.loads(json.dumps(cur.state_dict()))
    later = _ids(it.next_batch(16 * 3))
    assert not removed & set(later)
    for k in range(3):
        assert sorted(later[16 * k : 16 * (k + 1)]) == sorted(p.prompt_id for p in probs if p.prompt_id not in removed)
    cur2 = StandInCurriculum.from_state_dict(cur_state)
    it2 = PromptIterator(probs, seed=1, curriculum=cur2)
    it2.set_state(state)
    assert _ids(it2.next_batch(48)) == later


def test_mid_epoch_resume_keeps_epoch_membership():
    """Curriculum updates after the epoch started must not change the restored epoch's order."""
    probs = _problems(12)
    cur = StandInCurriculum()
    it = PromptIterator(probs, seed=2, curriculum=cur)
    for p in it.next_batch(12):
        cur.update(p.prompt_id, 8 if p.prompt_id % 3 == 0 else 1, 8)
    it.next_batch(3)  # epoch 1 started without the removed prompts
    state, cur_state = it.get_state(), cur.state_dict()
    cur.update(101, 8, 8)
    cur.update(101, 8, 8)  # now 101 would be removed too, but only from epoch 2 on
    expected = _ids(it.next_batch(30))
    it2 = PromptIterator(probs, seed=2, curriculum=StandInCurriculum.from_state_dict(cur_state))
    it2.set_state(state)
    c2 = it2.curriculum
    c2.update(101, 8, 8)
    c2.update(101, 8, 8)
    assert _ids(it2.next_batch(30)) == expected


def test_all_removed_raises():
    probs = _problems(5)
    cur = StandInCurriculum()
    it = PromptIterator(probs, seed=0, curriculum=cur)
    for p in it.next_batch(5):
        cur.update(p.prompt_id, 4, 4)
    with pytest.raises(AllPromptsRemovedError, match="all 5 training prompts"):
        next(it)


def test_bad_inputs():
    with pytest.raises(ValueError):
        PromptIterator([], seed=0)
    with pytest.raises(ValueError, match="distinct"):
        PromptIterator(_problems(3) + _problems(1), seed=0)
    it = PromptIterator(_problems(3), seed=0)
    with pytest.raises(ValueError, match="seed"):
        it.set_state({"seed": 1, "epoch": 0, "position": 0, "excluded": None})


def test_arith_prompt_data():
    data = build_prompt_data("arith", val_size=200, seed=0, n_train=2000)
    assert len(data.train) == 2000 and len(data.val) == 200
    assert not {p.prompt_id for p in data.train} & {p.prompt_id for p in data.val}
    batches = data.val_batches(64)
    assert [len(b) for b in batches] == [64, 64, 64, 8]
    assert [p for b in batches for p in b] == data.val
    assert data.val_batches(64) == batches  # fixed order
    it = data.train_iterator()
    train_ids = {p.prompt_id for p in data.train}
    assert {p.prompt_id for p in it.next_batch(2000)} == train_ids


def test_split_problems_disjoint_by_prompt():
    probs = arith_problems(50, seed=0)
    dup = Problem(prompt_id=10**6, prompt=probs[0].prompt, answer="x", solution="x", source="arith")
    train, val = split_problems(probs + [dup], 10, seed=4)
    assert len({p.prompt for p in val}) == 10
    assert not {p.prompt for p in train} & {p.prompt for p in val}
    assert len(train) + len(val) == 51
    assert split_problems(probs, 10, seed=4)[1] == split_problems(probs, 10, seed=4)[1]
    with pytest.raises(ValueError, match="val_size"):
        split_problems(probs, 50, seed=0)


def test_jsonl_prompt_data():
    data = build_prompt_data("jsonl", path=str(DATA / "gsm8k_test.jsonl"), val_size=100, seed=0)
    assert len(data.val) == 100 and len(data.train) + len(data.val) == 1319
    assert not {p.prompt for p in data.train} & {p.prompt for p in data.val}
    with pytest.raises(ValueError, match="val_size"):
        build_prompt_data("jsonl", path=str(DATA / "gsm8k_test.jsonl"), val_size=5000)


def test_with_real_npr_curriculum():
    from scalerl_jax.data import curriculum

    probs = arith_problems(30, seed=9)
    cur = curriculum.NPRCurriculum(threshold=0.9)
    it = PromptIterator(probs, seed=5, curriculum=cur)
    epoch0 = it.next_batch(30)
    solved = {p.prompt_id for p in epoch0[::3]}
    for p in epoch0:
        cur.update(p.prompt_id, 16 if p.prompt_id in solved else 3, 16)
    state = json.loads(json.dumps({"data": it.get_state(), "npr": cur.state_dict()}))
    later = _ids(it.next_batch(40))
    assert not solved & set(later)
    assert sorted(later[:20]) == sorted(p.prompt_id for p in probs if p.prompt_id not in solved)
    it2 = PromptIterator(probs, seed=5, curriculum=curriculum.NPRCurriculum.from_state_dict(state["npr"]))
    it2.set_state(state["data"])
    assert _ids(it2.next_batch(40)) == later
