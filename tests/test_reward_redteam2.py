"""Red team for the code reward beyond :mod:`tests.test_reward_redteam`: what a type-strict ``==`` alone lets
through. Hostile programs a policy could write, one or more per class, each graded false with the reason it must
fail with, and the host untouched (the facts of :class:`tests.test_reward_redteam.Host`), under bubblewrap and under
the rlimits mode (with and without namespaces), as root and as an unprivileged user; and honest programs the earlier
grader failed, which must pass.

Classes: control flow that leaves a call (an iteration-protocol exception raised in a call the tests make from
``map`` / ``filter`` / ``zip`` / ``next``); values that defeat comparisons other than ``==`` (NaN against a tolerance,
``bool`` for ``int`` through ``is``, ``not a != b``, ``in``, ``math.isclose``, ``unittest``, set members, dict keys,
chained orderings) and comparisons made inside a call, an operator or a lookup (``d[k]``, ``dict.get``, a
``Counter``'s keys, ``list.count`` / ``index`` / ``sort``, ``max`` / ``sorted`` / ``sum``, arithmetic and rounding of
a bool, set operators and methods); tests that evaluate what the program returned (``eval`` / ``exec`` /
``compile``), or code strings of their own; helpers the tests take from the task's prompt (redefined, right only at
the program's own answers, remembering their inputs, in a prompt continued mid-statement); exit statuses that
imitate a signal, a timeout or an unknown signal.
"""

from __future__ import annotations

import math
import textwrap

import pytest

from scalerl_jax.rewards.code_types import SandboxConfig
from tests.test_reward_redteam import (
    CPU_S,
    MODES,
    TIMEOUT_S,
    USER,
    Host,
    background_unprivileged_run,
    unprivileged_result,
)

# Reads the tests' verdict pipe number from the tests' own argv: run in the tests' interpreter, it writes "passed".
_TO_VERDICT = ("__import__('os').write(int(__import__('sys').argv[1]), b'passed\\t\\n') and "
               "__import__('os')._exit(0)")

# HumanEval 38 style: the prompt's encode() is the task's; decode() is the program's to write.
_SHIFT_PROMPT = '''
def encode(s: str) -> str:
    return "".join(chr((ord(c) - 97 + 7) % 26 + 97) for c in s)


def decode(s: str) -> str:
    """Invert encode()."""
'''
_SHIFT_TESTS = '''
def check(candidate):
    for s in ("hello", "policy", "unseen", "zebra"):
        assert candidate(encode(s)) == s
'''
# HumanEval 32 style: the prompt's poly() is the task's; find_zero() the program's.
_POLY_PROMPT = '''
def poly(xs: list, x: float) -> float:
    return sum(c * x ** i for i, c in enumerate(xs))


def find_zero(xs: list) -> float:
    """A zero of the polynomial with coefficients xs."""
'''
_POLY_TESTS = '''
def check(candidate):
    for xs in ([3, 1], [-@SECRET@, 1], [6, 5, 1]):
        assert abs(poly(xs, candidate(xs))) < 1e-6
'''

# The same task continued mid-statement: the prompt is not a module; its complete encode() is still the task's.
_SHIFT_PARTIAL = _SHIFT_PROMPT + '    return "".join(chr((ord(c) - 97 '

# name -> (program, tests, entry point, prompt, reasons it may end with). Placeholders as in test_reward_redteam.
CASES: dict[str, tuple[str, str, str | None, str, tuple[str, ...]]] = {
    # -- control flow that leaves a call
    "stopiteration_ends_tests_zip_map": (
        "def f(x):\n    raise StopIteration\n",
        "for got, want in zip(map(f, [1, 2]), [@SECRET@, 2]):\n    assert got == want\n", None, "", ("failed",)),
    "stopiteration_ends_all_over_map": (
        "def f(x):\n    raise StopIteration\n",
        "assert all(map(lambda x: f(x) == @SECRET@, [1, 2]))\n", None, "", ("failed",)),
    "stopiteration_subclass_ends_filter": (
        "class Done(StopIteration):\n    pass\ndef f(x):\n    raise Done('done')\n",
        "assert not list(filter(lambda x: f(x) != @SECRET@, [1, 2, 3]))\n", None, "", ("failed",)),
    "stopiteration_picks_next_default": (
        "def f(x):\n    raise StopIteration\n",
        "assert next(iter(map(f, [1])), @SECRET@) == @SECRET@\n", None, "", ("failed",)),
    "stopiteration_empties_list_of_map": (
        "def f(x):\n    raise StopIteration\n",
        "for r in list(map(f, [1, 2, 3])):\n    assert r == @SECRET@\n", None, "", ("failed",)),
    # -- values that defeat comparisons other than ==
    "nan_against_tolerance_assert_not_greater": (
        "def f():\n    return float('nan')\n", "assert not abs(f() - @SECRET@) > 1e-6\n", None, "", ("failed",)),
    "nan_against_tolerance_if_raise": (
        "def f():\n    return float('nan')\n",
        "if abs(f() - @SECRET@) > 1e-6:\n    raise AssertionError('too far')\n", None, "", ("failed",)),
    "nan_neither_less_nor_greater": (
        "def f():\n    return float('nan')\n",
        "assert not (f() < @SECRET@) and not (f() > @SECRET@)\n", None, "", ("failed",)),
    "nan_caught_by_the_tests": (
        "def f():\n    return float('nan')\n",
        "try:\n    bad = f() > @SECRET@ or f() < @SECRET@\nexcept BaseException:\n    bad = False\nassert not bad\n",
        None, "", ("failed",)),
    "bool_for_int_comparison_is_true": (
        "def f():\n    return True\n", "assert (f() == 1) is True\n", None, "", ("failed",)),
    "bool_for_int_not_ne": ("def f():\n    return True\n", "assert not f() != 1\n", None, "", ("failed",)),
    "bool_for_int_in_list": ("def f():\n    return True\n", "assert f() in [1, @SECRET@]\n", None, "", ("failed",)),
    "bool_for_int_isclose": (
        "def f():\n    return True\n", "import math\nassert math.isclose(f(), 1)\n", None, "", ("failed",)),
    "bool_for_int_unittest_assert_equal": (
        "def f():\n    return True\n", "import unittest\nunittest.TestCase().assertEqual(f(), 1)\n", None, "",
        ("failed",)),
    "bool_for_int_unittest_assert_in": (
        "def f():\n    return False\n", "import unittest\nunittest.TestCase().assertIn(f(), (0, @SECRET@))\n",
        None, "", ("failed",)),
    "bool_in_set_member": ("def f():\n    return {True, 2}\n", "assert f() == {1, 2}\n", None, "", ("failed",)),
    "bool_as_dict_key": ("def f():\n    return {True: 'a'}\n", "assert f() == {1: 'a'}\n", None, "", ("failed",)),
    "bool_nested_in_frozenset": (
        "def f():\n    return {(True, 2)}\n", "assert f() == {(1, 2)}\n", None, "", ("failed",)),
    "bool_in_chained_ordering": (
        "def f():\n    return True\n", "assert 1 <= f() <= 1\n", None, "", ("failed",)),
    "bool_in_all_of_comparisons": (
        "def f(x):\n    return True\n", "assert all(f(x) == 1 for x in range(3))\n", None, "", ("failed",)),
    # -- ... and comparisons made inside a call, an operator or a lookup, not by a comparison the tests wrote
    "bool_as_dict_subscript": ("def f():\n    return {True: 'a'}\n", "assert f()[1] == 'a'\n", None, "", ("failed",)),
    "bool_through_dict_get": ("def f():\n    return {True: 'a'}\n", "assert f().get(1) == 'a'\n", None, "",
                              ("failed",)),
    "bool_key_of_the_tests_counter": (
        "def f():\n    return [True, True]\n", "from collections import Counter\nassert Counter(f())[1] == 2\n", None,
        "", ("failed",)),
    "bool_counted_by_list_count": ("def f():\n    return [True, True]\n", "assert f().count(1) == 2\n", None, "",
                                   ("failed",)),
    "bool_found_by_list_index": ("def f():\n    return [0, True]\n", "assert f().index(1) == 1\n", None, "",
                                 ("failed",)),
    "bool_summed_with_numbers": ("def f():\n    return [True, 2]\n", "assert sum(f()) == 3\n", None, "", ("failed",)),
    "bool_in_a_tolerance_difference": ("def f():\n    return True\n", "assert abs(f() - 1) < 1e-9\n", None, "",
                                       ("failed",)),
    "bool_scaled_by_arithmetic": ("def f():\n    return True\n", "assert f() * 2 == 2\n", None, "", ("failed",)),
    "bool_negated": ("def f():\n    return True\n", "assert -f() == -1\n", None, "", ("failed",)),
    "bool_rounded": ("def f():\n    return True\n", "import math\nassert round(f(), 2) == math.fabs(f()) == 1.0\n",
                     None, "", ("failed",)),
    "bool_merged_by_a_set_operation": ("def f():\n    return {True, 2}\n", "assert len(f() & {1, 2}) == 2\n", None, "",
                                       ("failed",)),
    "bool_subset_by_method": ("def f():\n    return {True}\n", "assert f().issubset({1, 2})\n", None, "", ("failed",)),
    "bool_as_a_sequence_index": ("def f():\n    return True\n", "assert [10, 20][f()] == 20\n", None, "",
                                 ("failed",)),
    "nan_wins_max": ("def f():\n    return [3, float('nan')]\n", "assert max(f()) == 3\n", None, "", ("failed",)),
    "nan_sorted_out_of_the_way": ("def f():\n    return [float('nan'), 1, 2]\n", "assert sorted(f())[1:] == [1, 2]\n",
                                  None, "", ("failed",)),
    "nan_in_list_sort": ("def f():\n    return [float('nan'), 2, 1]\n",
                         "r = f()\nr.sort()\nassert r[1:] == [1, 2]\n", None, "", ("failed",)),
    # -- tests that evaluate what the program returned, or code strings of their own
    "eval_of_the_tests_own_comparison": ("def f():\n    return True\n", "assert eval('f() == 1')\n", None, "",
                                         ("failed",)),
    "exec_of_the_tests_own_comparison": ("def f():\n    return True\n", "exec('ok = f() == 1')\nassert ok\n", None,
                                         "", ("failed",)),
    "eval_of_returned_bool_arithmetic": ("def f():\n    return 'True * 24'\n", "assert eval(f()) == 24\n", None, "",
                                         ("failed",)),
    "eval_of_returned_text_writes_verdict": (
        f"def f():\n    return {_TO_VERDICT!r}\n", "assert eval(f()) == 24\n", None, "", ("failed",)),
    "eval_with_empty_builtins_escape": (
        "def f():\n    return \"(i := [c for c in ().__class__.__base__.__subclasses__() if c.__name__ == "
        "'catch_warnings'][0]()._module.__builtins__['__import__']) and i('os').write(int(i('sys').argv[1]), "
        "b'passed\\t\\n') and i('os')._exit(0)\"\n",
        "assert eval(f(), {'__builtins__': {}}) == 24\n", None, "", ("failed",)),
    "exec_of_returned_text": (
        f"def f():\n    return {('ok = ' + _TO_VERDICT)!r}\n", "ok = 0\nexec(f())\nassert ok == @SECRET@\n", None, "",
        ("failed",)),
    "compile_of_returned_text": (
        f"def f():\n    return {_TO_VERDICT!r}\n", "assert eval(compile(f(), '<answer>', 'eval')) == 24\n", None, "",
        ("failed",)),
    # -- helpers the tests take from the task's prompt
    "helper_redefined_to_identity": (
        _SHIFT_PROMPT + "def encode(s):\n    return s\ndef decode(s):\n    return s\n", _SHIFT_TESTS, "decode",
        _SHIFT_PROMPT, ("failed",)),
    "helper_remembers_its_inputs": (
        _SHIFT_PROMPT + "SEEN = {}\ndef encode(s):\n    SEEN[s[::-1]] = s\n    return s[::-1]\n"
        "def decode(s):\n    return SEEN.get(s, '')\n", _SHIFT_TESTS, "decode", _SHIFT_PROMPT, ("failed",)),
    "helper_right_only_at_the_programs_answer": (
        _POLY_PROMPT + "def poly(xs, x):\n    return 0.0 if x == 12345.0 else 1.0\n"
        "def find_zero(xs):\n    return 12345.0\n", _POLY_TESTS, "find_zero", _POLY_PROMPT, ("failed",)),
    "helper_redefined_in_a_task_continued_mid_statement": (
        _SHIFT_PARTIAL + "- 0) % 26 + 97) for c in s)\n\ndef encode(s):\n    return s\n"
        "\ndef decode(s):\n    return s\n",
        _SHIFT_TESTS, "decode", _SHIFT_PARTIAL, ("failed",)),
    "helper_only_redefined": (
        _POLY_PROMPT + "def poly(xs, x):\n    return 0\n", _POLY_TESTS, "find_zero", _POLY_PROMPT, ("failed",)),
    # -- the program picks its own failure reason
    "exit_status_of_no_signal": ("import os\ndef f():\n    os._exit(168)\n", "assert f() == @SECRET@\n", None, "",
                                 ("crash",)),
    "exit_status_124_reads_as_timeout": ("import os\ndef f():\n    os._exit(124)\n", "assert f() == @SECRET@\n", None,
                                         "", ("crash",)),
    "exit_status_of_sigxcpu": ("import os\ndef f():\n    os._exit(152)\n", "assert f() == @SECRET@\n", None, "",
                               ("crash",)),
    "exit_status_at_import": ("import os\nos._exit(200)\n", "assert f() == @SECRET@\n", None, "", ("crash",)),
}

# Honest programs the earlier grader failed (or that the changes above must keep passing): every one must pass.
HONEST: dict[str, tuple[str, str, str | None, str]] = {
    "counter_for_dict": ("import collections\ndef f(s):\n    return collections.Counter(s)\n",
                         "assert f('abca') == {'a': 2, 'b': 1, 'c': 1}\n", None, ""),
    "counter_against_counter": ("from collections import Counter\ndef f(s):\n    return Counter(s)\n",
                                "from collections import Counter\nassert f('aab') == Counter({'a': 2, 'b': 1})\n",
                                None, ""),
    "ordereddict_and_defaultdict": (
        "import collections\ndef f():\n    d = collections.defaultdict(list)\n    d['x'].append(1)\n"
        "    return collections.OrderedDict(d)\ndef g():\n    d = collections.defaultdict(int)\n    d[3] += 2\n"
        "    return d\n", "assert f() == {'x': [1]}\nassert g() == {3: 2}\nassert 3 in g()\n", None, ""),
    "namedtuple_for_tuple": ("from collections import namedtuple\nP = namedtuple('P', 'x y')\ndef f():\n"
                             "    return [P(1, 2), P(3, 4)]\n", "assert f() == [(1, 2), (3, 4)]\n", None, ""),
    "userlist_for_list": ("from collections import UserList\ndef f():\n    return UserList([1, 2])\n",
                          "assert f() == [1, 2]\n", None, ""),
    "exception_subclass_caught_as_its_base": (
        "class Invalid(ValueError):\n    pass\ndef f(x):\n    if x < 0:\n        raise Invalid('negative')\n"
        "    return x\n",
        "try:\n    f(-1)\n    assert False\nexcept ValueError as e:\n    assert 'negative' in str(e)\n",
        None, ""),
    "exception_subclass_of_keyerror_and_builtin_by_name": (
        "class Missing(KeyError):\n    pass\ndef f(x):\n    if x:\n        raise Missing(x)\n"
        "    raise ZeroDivisionError\n",
        "try:\n    f(1)\nexcept LookupError:\n    pass\nelse:\n    assert False\n"
        "try:\n    f(0)\nexcept ArithmeticError:\n    pass\nelse:\n    assert False\n", None, ""),
    "make_24_expression_evaluated": ("def solve():\n    return '(1 + 2 + 3) * 4'\n",
                                     "assert eval(solve()) == 24\nassert eval(compile(solve(), 'x', 'eval')) == 24\n",
                                     None, ""),
    "tests_exec_their_own_code": ("def f():\n    return 2\n", "assert f() == 2\nexec('y = f() * 3')\nassert y == 6\n",
                                  None, ""),
    "isclose_and_tolerances": ("def f():\n    return 0.1 + 0.2\n",
                               "import math\nassert math.isclose(f(), 0.3)\nassert abs(f() - 0.3) < 1e-9\n"
                               "assert not abs(f() - 0.3) > 1e-9\nassert 0 < f() < 1\n", None, ""),
    "ints_and_floats_compare_by_value": ("def f():\n    return {1: [2.0, (3, 4)]}\n",
                                         "assert f() == {1.0: [2, (3, 4)]}\nassert 2 in f()[1]\n", None, ""),
    "unittest_honest": ("def f():\n    return [3, 1, 2]\n",
                        "import unittest\nt = unittest.TestCase()\nt.assertEqual(f(), [3, 1, 2])\n"
                        "t.assertCountEqual(f(), [1, 2, 3])\nt.assertIn(1, f())\nt.assertAlmostEqual(f()[0], 3.0)\n",
                        None, ""),
    "views_lookups_and_element_methods": (
        "def f():\n    return {1: 'a', 2: 'b'}\ndef g():\n    return [1, 1.0, 2, True]\n",
        "assert f().keys() == {1, 2} and f()[1] == 'a' and f().get(3) is None and f().get(1.0) == 'a'\n"
        "r = g()\nassert r.count(1) == 2 and r.index(2) == 2 and r.count(True) == 1\nr.remove(True)\n"
        "assert r == [1, 1.0, 2]\n", None, ""),
    "orderings_sums_and_set_operations": (
        "def f():\n    return [(1, 'b'), (3, 'a'), (2, 'c')]\ndef g():\n    return [True, False, True]\n"
        "def h():\n    return {1, 2, 3}\n",
        "assert max(f()) == (3, 'a') and min(f(), key=lambda t: t[1]) == (3, 'a')\n"
        "assert sorted(f(), reverse=True)[0][0] == 3 and max([], default=5) == 5 and max(1, 2) == 2\n"
        "assert sum(g()) == 2\nn = 0\nfor x in g():\n    n += x == True\nassert n == 2\n"
        "assert h() & {2, 3, 4} == {2, 3} and h() - {1} == {2, 3} and h().union([4]) == {1, 2, 3, 4}\n"
        "assert abs(h().pop() - 1) < 1e-9 and -len(h()) == -3 and round(2.5) == 2\n", None, ""),
    "tests_eval_their_own_code_on_program_values": (
        "def f():\n    return 3\n",
        "assert eval('f() + 1') == 4 and eval('  f()') == 3\nd = {}\nexec('y = f() * 2', globals(), d)\n"
        "assert d['y'] == 6\nfrom collections import Counter\nassert Counter('aab')['a'] == 2\n", None, ""),
    "helper_from_a_prompt_continued_mid_statement": (_SHIFT_PARTIAL + "- 7) % 26 + 97) for c in s)\n", _SHIFT_TESTS,
                                                     "decode", _SHIFT_PARTIAL),
    "helper_from_prompt_used": (_SHIFT_PROMPT + "def decode(s):\n"
                                "    return ''.join(chr((ord(c) - 97 - 7) % 26 + 97) for c in s)\n",
                                _SHIFT_TESTS, "decode", _SHIFT_PROMPT),
}


def _poly_root_program() -> str:  # an honest find_zero for _POLY_TESTS (Newton's method on the program's own poly)
    return _POLY_PROMPT + textwrap.dedent("""
        def find_zero(xs):
            x = 0.0
            for _ in range(200):
                d = sum(i * c * x ** (i - 1) for i, c in enumerate(xs) if i)
                x = x - poly(xs, x) / d if d else x + 1.0
            return x
        """)


HONEST["helper_from_prompt_poly"] = (_poly_root_program(), _POLY_TESTS, "find_zero", _POLY_PROMPT)


def run_redteam2(mode: str) -> dict:
    """Every case and honest program under ``mode`` through one pool; ``{"describe", "cases": {name: [passed,
    reason, detail, allowed]}, "honest": {name: [passed, reason, detail]}, "unhealthy": str, "host": [...]}``."""
    import scalerl_jax.rewards.sandbox as sb
    from scalerl_jax.rewards.code_pool import CodeJob, CodePool, SandboxUnhealthy

    host = Host()
    sb.NAMESPACES = mode != "rlimits-nons"
    try:
        cfg = SandboxConfig(timeout_s=TIMEOUT_S, cpu_s=CPU_S, memory_mb=512, max_procs=8, max_output_bytes=1 << 16,
                            isolation="rlimits" if mode.startswith("rlimits") else mode, workers=4)
        with CodePool(cfg) as pool:
            names = list(CASES)
            jobs = [CodeJob(host.fill(textwrap.dedent(CASES[n][0]), ""), host.fill(CASES[n][1], ""), CASES[n][2],
                            CASES[n][3]) for n in names]
            results = pool.map(jobs)
            honest_names = list(HONEST)
            honest = pool.map([CodeJob(host.fill(p, ""), host.fill(t, ""), e, pr)
                               for p, t, e, pr in HONEST.values()])
            describe = pool.sandbox.describe()
        # a policy that makes every program exit with a status that is no signal must not stop the run
        unhealthy = ""
        with CodePool(cfg, max_error_rate=0.05, min_runs=8) as pool:
            try:
                crashed = pool.map([CodeJob(f"import os\nos._exit({code})\n", "assert f() == 1\n")
                                    for code in (168, 169, 200, 124, 152, 137, 255, 129)])
                unhealthy = "" if all(r.reason == "crash" for r in crashed) else repr(crashed)
            except SandboxUnhealthy as e:
                unhealthy = str(e)
        return {"describe": describe,
                "cases": {n: [r.passed, r.reason, r.detail[:200], list(CASES[n][4])]
                          for n, r in zip(names, results, strict=True)},
                "honest": {n: [r.passed, r.reason, r.detail[:200]] for n, r in zip(honest_names, honest, strict=True)},
                "unhealthy": unhealthy, "host": host.violations()}
    finally:
        sb.NAMESPACES = True
        host.close()


def _check(out: dict, mode: str) -> None:
    table = "\n".join(f"  {n}: passed={p} reason={r} ({d})" for n, (p, r, d, _) in out["cases"].items())
    print(f"\n[{mode}] {out['describe']}\n{table}")
    failed_honest = {n: v for n, v in out["honest"].items() if not v[0]}
    assert not failed_honest, f"honest programs failed under {mode}: {failed_honest}"
    bad = {n: (p, r, d) for n, (p, r, d, ok) in out["cases"].items() if p or r not in ok}
    assert not bad, f"cases graded wrongly under {mode}: {bad}"
    assert not out["unhealthy"], f"programs' exit statuses counted as sandbox errors under {mode}: {out['unhealthy']}"
    assert not out["host"], f"the host was touched under {mode}: {out['host']}"


def test_at_least_25_techniques_and_every_class(unprivileged_run2):
    assert len(CASES) >= 25
    prefixes = ("stop", "nan_", "bool_", "eval_", "exec_", "compile_", "helper_", "exit_status_")
    assert all(any(n.startswith(p) for n in CASES) for p in prefixes)


@pytest.mark.parametrize("mode", MODES)
def test_redteam2_as_this_user(mode):
    from scalerl_jax.rewards.sandbox import Sandbox, SandboxError

    if mode == "bwrap":
        try:
            Sandbox(SandboxConfig(isolation="bwrap"))
        except SandboxError as e:
            pytest.skip(f"bubblewrap cannot start on this machine: {e}")
    _check(run_redteam2(mode), mode)


@pytest.fixture(scope="module")
def unprivileged_run2():
    yield from background_unprivileged_run("tests.test_reward_redteam2", "run_redteam2")


@pytest.mark.parametrize("mode", MODES)
def test_redteam2_as_an_unprivileged_user(mode, unprivileged_run2):
    _check(unprivileged_result(unprivileged_run2, mode), f"{mode}, as {USER}")


# ---- the comparison helpers against hand-worked expectations (no sandbox) ----

def test_strict_comparisons_against_hand_worked_cases():
    from scalerl_jax.rewards import strict_compare as sc

    assert sc._strict_eq(1, 1.0) and not sc._strict_eq(True, 1) and not sc._strict_eq([1], (1,))
    assert not sc._strict_eq({True}, {1}) and sc._strict_eq({1}, {1.0}) and not sc._strict_eq({(True,)}, {(1,)})
    assert not sc._strict_eq({True: 0}, {1: 0}) and sc._strict_eq({1: 0}, {1.0: 0})
    assert not sc._strict_eq(math.nan, math.nan)
    assert sc._strict_in(1, [True, 1]) and not sc._strict_in(True, [1]) and not sc._strict_in(1, {True: 0})
    assert sc._strict_in("b", "abc") and sc._strict_in(2, range(3)) and not sc._strict_in(True, range(3))
    assert sc._strict_chain(("Lt", "Lt"), 1, lambda: 2, lambda: 3)
    calls = []
    assert not sc._strict_chain(("Lt", "Lt"), 3, lambda: calls.append(1) or 2, lambda: calls.append(2) or 9)
    assert calls == [1]  # a chain stops at its first false link, as Python's does
    for a, b in ((math.nan, 1.0), (1.0, math.nan), (True, 1), ([1, math.nan], [1, 2])):
        with pytest.raises(sc._Unsound):
            sc._strict_cmp("Gt", a, b)
    import collections

    assert sc._strict_eq(collections.Counter("aab"), {"a": 2, "b": 1})
    assert sc._strict_eq(collections.namedtuple("P", "x")(1), (1,))
    assert sc._strict_eq({1: 0}.keys(), {1}) and not sc._strict_eq({True: 0}.keys(), {1})


def test_comparisons_inside_calls_operators_and_lookups_against_hand_worked_cases():
    from scalerl_jax.rewards import strict_compare as sc

    # lookups: the stored key of the same kind, or nothing
    assert sc._strict_item({1.0: "a"}, 1) == "a" and sc._strict_item([5, 6], 1) == 6
    for d, k in (({True: "a"}, 1), ({1: "a"}, True), ({(True, 2): "a"}, (1, 2)), ({0: "a"}, False)):
        with pytest.raises(sc._Unsound):
            sc._strict_item(d, k)
    with pytest.raises(KeyError):
        sc._strict_item({2: "a"}, 1)
    assert sc._strict_method({True: "a"}, "get", True) == "a" and sc._strict_method({2: 0}, "get", 1, 9) == 9
    # list methods count and find by the strict equality: [1, 1.0, True, 2] holds two ones and one True
    xs = [1, 1.0, True, 2]
    assert sc._strict_method(xs, "count", 1) == 2 and sc._strict_method(xs, "count", True) == 1
    assert sc._strict_method(xs, "index", True) == 2 and sc._strict_method(xs, "index", 1, 1) == 1
    with pytest.raises(ValueError):
        sc._strict_method([True], "index", 1)
    sc._strict_method(xs, "remove", True)
    assert xs == [1, 1.0, 2] and type(xs[1]) is float
    ys = [3, 1, 2]
    sc._strict_method(ys, "sort", reverse=True)
    assert ys == [3, 2, 1] and sc._strict_method("abca", "count", "a") == 2
    # orderings: a NaN, or a bool among numbers (also column by column in tuples); bools among bools are fine
    for vals in ([1, math.nan], [True, 2], [(1, True), (2, 3)], [[math.nan]]):
        with pytest.raises(sc._Unsound):
            sc._orderable(vals, "x")
    sc._orderable([(1, True), (2, False)], "x")
    sc._orderable([True, False], "x")
    b = {"max": max, "min": min, "sorted": sorted, "sum": sum, "abs": abs, "round": round}
    sc._strict_builtins(b)
    calls = []
    assert b["max"]([3, 1, 2], key=lambda v: calls.append(v) or -v) == 1 and calls == [3, 1, 2]  # one call each
    assert b["max"]([(1, "x"), (1, "y")], key=lambda t: t[0]) == (1, "x")  # the first of equals, as max()
    assert b["sorted"]([(1, "b"), (0, "c"), (1, "a")], key=lambda t: t[0], reverse=True) == [(1, "b"), (1, "a"),
                                                                                              (0, "c")]
    assert b["min"]([], default=None) is None and b["sum"]([True, True]) == 2 and b["sum"]([0.5, 1], 1) == 2.5
    for call in (lambda: b["sum"]([True, 2]), lambda: b["abs"](True), lambda: b["round"](False),
                 lambda: b["sorted"]([2, math.nan])):
        with pytest.raises(sc._Unsound):
            call()
    # operators: a bool with a number; set operations that would merge a bool with a number
    assert sc._strict_binop("Sub", 3, 1.5) == 1.5 and sc._strict_binop("Add", True, False) == 1
    assert sc._strict_binop("BitAnd", {1, 2}, {2.0}) == {2} and sc._strict_binop("Add", "a", "b") == "ab"
    for op, a, b2 in (("Sub", True, 1), ("Mult", 2.0, False), ("BitOr", {True}, {1}), ("BitAnd", {(1, 2)},
                                                                                      {(True, 2)})):
        with pytest.raises(sc._Unsound):
            sc._strict_binop(op, a, b2)
    assert sc._strict_unary("USub", 2) == -2
    with pytest.raises(sc._Unsound):
        sc._strict_unary("USub", True)


# ---- resources the limits did not count: each program tries, and its tests check the sandbox refused ----

CONTAINED: dict[str, tuple[str, str]] = {
    "memory_in_a_memfd": ("import os\ndef f():\n    try:\n        fd = os.memfd_create('hold')\n"
                          "    except OSError:\n        return 'refused'\n    for _ in range(64):\n"
                          "        os.write(fd, b'x' * (1 << 20))\n    return 'held'\n", "assert f() == 'refused'\n"),
    "system_v_shared_memory": ("import ctypes\ndef f():\n    libc = ctypes.CDLL(None, use_errno=True)\n"
                               "    shm = libc.shmget(0x5ca1e, 1 << 20, 0o1666)\n"
                               "    return 'refused' if shm < 0 else 'made'\n", "assert f() == 'refused'\n"),
    "scratch_over_its_cap": ("import os\ndef f():\n    n = 0\n    try:\n        for i in range(64):\n"
                             "            with open(f'fill{i}', 'wb') as g:\n"
                             "                g.write(b'x' * (3 << 20))\n"
                             "            n += 3 << 20\n    except OSError:\n        pass\n    return n\n",
                             "assert f() <= 16 << 20\n"),
}


@pytest.mark.parametrize("mode", ("bwrap", "rlimits", "rlimits-nons"))
def test_resources_outside_the_limits_are_refused(mode):
    import scalerl_jax.rewards.sandbox as sb
    from scalerl_jax.rewards.code_pool import CodeJob, CodePool

    sb.NAMESPACES = mode != "rlimits-nons"
    try:
        cfg = SandboxConfig(timeout_s=TIMEOUT_S, cpu_s=CPU_S, memory_mb=512, max_file_mb=16,
                            isolation="rlimits" if mode.startswith("rlimits") else mode, workers=3)
        try:
            pool = CodePool(cfg)
        except sb.SandboxError as e:
            pytest.skip(f"{mode} cannot start here: {e}")
        with pool:
            results = pool.map([CodeJob(p, t) for p, t in CONTAINED.values()])
    finally:
        sb.NAMESPACES = True
    bad = {n: (r.reason, r.detail) for n, r in zip(CONTAINED, results, strict=True) if not r.passed}
    assert not bad, f"under {mode}: {bad}"
    with open("/proc/sysvipc/shm") as f:  # no segment of that key on the host, whatever the mode
        assert not [line for line in f if line.split()[:1] == [str(0x5ca1e)]]


@pytest.mark.parametrize("mode", ("bwrap", "rlimits"))
def test_a_cgroup_counts_memory_and_cpu_that_per_process_limits_miss(mode):
    """Where the host lets the trainer make cgroups (root, writable v1 hierarchies): 300 MB of tmpfs files (outside
    the address-space limit, under a 512 MB tmpfs cap) end as ``memory`` at a 128 MB limit, from the kernel's OOM
    count; seven spinning processes in their own sessions, each under its own 2 s CPU limit, end as ``timeout`` once
    the tree used its CPU seconds together (``tree_cpu_limit_s``: 3.5), held to one core all along (seven spinners
    on two cores would get there in half the time); nothing of either run is left in the hierarchy."""
    import os

    import scalerl_jax.rewards.sandbox as sb
    from scalerl_jax.rewards import cgroups
    from scalerl_jax.rewards.code_types import tree_cpu_limit_s

    groups = cgroups.find()
    if groups is None:
        pytest.skip("no writable cgroup v1 memory/cpu/cpuacct/pids hierarchies here (or not root)")
    cfg = SandboxConfig(timeout_s=60.0, cpu_s=2.0, memory_mb=128, max_file_mb=512, isolation=mode)
    try:
        box = sb.Sandbox(cfg)
    except sb.SandboxError as e:
        pytest.skip(f"{mode} cannot start here: {e}")
    assert "cgroup v1" in box.describe()
    hold = ("def f():\n    n = 0\n    for i in range(100):\n        with open(f'hold{i}', 'wb') as g:\n"
            "            g.write(b'x' * (3 << 20))\n        n += 3\n    return n\n")
    r = box.run(hold, "assert f() == 300\n")
    assert (r.passed, r.reason) == (False, "memory") and "cgroup" in r.detail, r
    spin = ("import os\ndef f():\n    for _ in range(6):\n        if os.fork() == 0:\n            os.setsid()\n"
            "            while True:\n                pass\n    while True:\n        pass\n")
    r = box.run(spin, "assert f() == 1\n")
    assert (r.passed, r.reason) == (False, "timeout") and "CPU seconds together" in r.detail, r
    assert r.seconds < 30, r  # a hang guard: the tree's 3.5 CPU seconds at 1 core come long before the wall clock
    assert r.seconds >= tree_cpu_limit_s(cfg) / cfg.cpu_cores - 0.5, r  # the quota: no more than one core's worth
    assert not [d for d in os.listdir(groups.parents["memory"]) if d.startswith("run-")]
    # what a trainer killed before its clean-up left (a pid above the kernel's pid_max: never running) is swept
    base = os.path.dirname(groups.parents["cpu"])
    stale = os.path.join(base, f"{cgroups._prefix()}4194999")
    elsewhere = os.path.join(base, "scalerl-another.host-4194999")
    for d in (stale, elsewhere):
        os.makedirs(os.path.join(d, "run-4194999-1"))
    try:
        cgroups._sweep_stale(base)
        assert not os.path.exists(stale) and os.path.exists(elsewhere)  # another host's groups are not ours to sweep
    finally:
        for d in (os.path.join(elsewhere, "run-4194999-1"), elsewhere):
            os.rmdir(d)


def test_rlimits_without_landlock_refuses_unless_named_weak():
    import scalerl_jax.rewards.sandbox as sb

    sb.LANDLOCK = False
    try:
        with pytest.raises(sb.SandboxError, match="Landlock"):
            sb.Sandbox(SandboxConfig(isolation="rlimits"))
        weak = sb.Sandbox(SandboxConfig(isolation="rlimits-weak", timeout_s=TIMEOUT_S))
        assert weak.isolation == "rlimits" and weak.confinement["landlock"] == 0
        assert weak.run("def f():\n    return 2\n", "assert f() == 2\n").passed
    finally:
        sb.LANDLOCK = True


# ---- honest programs beside hostile ones in one pool ----

_HOSTILE_NEIGHBOURS = (
    "def f():\n    while True:\n        pass\n",  # spins to the CPU limit
    "import os\ndef f():\n    while True:\n        try:\n            os.fork()\n"
    "        except OSError:\n            pass\n",  # a fork bomb
    "import os\ndef f():\n    for _ in range(7):\n        if os.fork() == 0:\n            os.setsid()\n"
    "            while True:\n                pass\n    return 0\n",  # children spinning in their own sessions
    "import threading\ndef spin():\n    while True:\n        pass\ndef f():\n    for _ in range(6):\n"
    "        threading.Thread(target=spin, daemon=True).start()\n    spin()\n",
    "def f():\n    x = []\n    while True:\n        x.append(bytearray(1 << 24))\n",  # memory to its limit
    "import sys\ndef f():\n    while True:\n        sys.stdout.write('x' * 65536)\n",  # output past the cap
    "import time\ndef f():\n    time.sleep(3600)\n",  # holds its worker to the wall clock
    "import os\ndef f():\n    os._exit(168)\n",
)


@pytest.mark.parametrize("mode", ("bwrap", "rlimits"))
def test_honest_programs_pass_beside_hostile_ones(mode):
    from scalerl_jax.data.code_tasks import load_humaneval
    from scalerl_jax.rewards.code_pool import CodeJob, CodePool
    from scalerl_jax.rewards.sandbox import SandboxError

    tasks = load_humaneval()[:8]
    cfg = SandboxConfig(timeout_s=TIMEOUT_S, cpu_s=CPU_S, memory_mb=512, max_procs=8, max_output_bytes=1 << 16,
                        isolation=mode, workers=8)
    try:
        pool = CodePool(cfg)
    except SandboxError as e:
        pytest.skip(f"{mode} cannot start here: {e}")
    honest = [CodeJob(t.reference_program(), t.tests, t.entry_point, t.code_prefix) for t in tasks]
    hostile = [CodeJob(p, "assert f() == 1\n") for p in _HOSTILE_NEIGHBOURS]
    # interleaved: both kinds start together
    jobs = [j for pair in zip(hostile, honest, strict=True) for j in pair]
    with pool:
        results = pool.map(jobs)
    honest_results = results[1::2]
    late = {t.task_id: (r.reason, round(r.seconds, 2), r.detail[:120])
            for t, r in zip(tasks, honest_results, strict=True) if not r.passed or r.seconds >= cfg.timeout_s}
    assert not late, f"honest programs failed beside hostile ones under {mode}: {late}"
    assert not any(r.passed for r in results[0::2])
