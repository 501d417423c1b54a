"""The tests interpreter's type-strict comparisons: the helpers every comparison of the tests goes through, the AST
rewrite that routes them there, and the replacements for ``math.isclose`` / ``cmath.isclose`` and ``unittest``'s
value assertions.

They run in the tests process only (:func:`scalerl_jax.rewards.harness.source` ships them as source to
``python -I -S -c``, so every function here is self-contained: imports inside, no module globals). A module of
their own because they are one idea -- what "equal", "in" and "ordered" mean for values that came back from the
program -- and the one piece of the harness that is also exercised directly, in-process, against hand-worked cases.

Equality is by exact type (a bool is not an int, a tuple not a list; ints, floats and complex numbers by value),
containers element by element (set members and dict keys included, :func:`_canon`); an ordering that means
nothing (a NaN, a bool against a number) raises :class:`_Unsound`, which fails the program even if the tests catch
it. Values of the tests' own making (``Counter``, ``OrderedDict``, a namedtuple...) compare as their plain value.
"""

from __future__ import annotations


class _Unsound(BaseException):
    """A comparison that no value may satisfy either way round (a NaN ordered against a bound, a bool ordered
    against a number): it fails the program whatever the tests do with the result, even if they catch it."""

    seen = ""

    def __init__(self, msg: str) -> None:
        super().__init__(msg)
        type(self).seen = type(self).seen or msg


def _plain(v):
    """A value of the tests' own (trusted) making as the plain value it compares as: a standard-library mapping or
    sequence subclass (``Counter``, ``OrderedDict``, ``defaultdict``, a namedtuple, ``UserList``...) becomes its
    plain ``dict`` / ``list`` / ``tuple``; the program's values are exact plain types already."""
    t = type(v)
    if t in (int, float, str, bool, list, tuple, dict, set, frozenset, bytes, complex) or v is None:
        return v
    for base in (dict, list, tuple, set, frozenset, str, bytes, float, int):
        if isinstance(v, base):
            return base(v)
    data = getattr(v, "data", None)  # collections.UserDict / UserList / UserString
    if type(data) in (dict, list, str) and type(v).__module__ == "collections":
        return data
    return v


def _canon(v):
    """A hashable key under which two values are equal exactly when :func:`_strict_eq` says so (for set members
    and dict keys): a bool keyed apart from the numbers, ints and floats by value."""
    v = _plain(v)
    t = type(v)
    if t in (int, float, complex):
        return ("n", v)
    if t is tuple:
        return ("t", tuple(_canon(x) for x in v))
    if t is frozenset:
        return ("f", frozenset(_canon(x) for x in v))
    return (t, v)


def _strict_eq(a, b) -> bool:
    """``a == b`` with exact types: a bool is not an int, a tuple not a list; ints, floats and complex numbers
    compare by value (the test's own float semantics: NaN equals nothing). Containers compare element by element
    the same way, set members and dict keys included."""
    a, b = _plain(a), _plain(b)
    ta, tb = type(a), type(b)
    if ta is not tb:
        return ta in (int, float, complex) and tb in (int, float, complex) and a == b
    if ta is list or ta is tuple:
        return len(a) == len(b) and all(_strict_eq(x, y) for x, y in zip(a, b))
    if ta is dict:
        if len(a) != len(b):
            return False
        keys = {_canon(k): k for k in b}
        return len(keys) == len(b) and all(_canon(k) in keys and _strict_eq(a[k], b[keys[_canon(k)]]) for k in a)
    if ta is set or ta is frozenset:
        return len(a) == len(b) and {_canon(x) for x in a} == {_canon(x) for x in b}
    return a == b


def _ordered(a, b) -> None:
    """Raise :class:`_Unsound` when ordering ``a`` against ``b`` means nothing: a NaN (which makes every ordering
    false, so "fail if the difference is over tol" passes), or a bool against a number; lists and tuples element by
    element."""
    a, b = _plain(a), _plain(b)
    ta, tb = type(a), type(b)
    for x in (a, b):
        if type(x) is float and x != x or type(x) is complex and (x.real != x.real or x.imag != x.imag):
            raise _Unsound("a NaN in an ordering comparison")
    if (ta is bool) != (tb is bool) and (ta in (int, float, bool) and tb in (int, float, bool)):
        raise _Unsound(f"a {ta.__name__} ordered against a {tb.__name__}")
    if ta is tb and ta in (list, tuple):
        for x, y in zip(a, b):
            _ordered(x, y)


def _strict_in(x, c) -> bool:
    """``x in c`` with :func:`_strict_eq`'s types: ``True in [1]`` is false, ``1 in {True: 0}`` too."""
    c = _plain(c)
    tc = type(c)
    if tc in (str, bytes, bytearray):
        return x in c
    if tc in (dict, set, frozenset) or tc.__name__ in ("dict_keys", "dict_items") and tc.__module__ == "builtins":
        try:
            return _canon(x) in {_canon(k) for k in c}
        except TypeError:
            return x in c  # unhashable: the same TypeError the plain test would raise
    if tc in (list, tuple, range) or not hasattr(tc, "__contains__") or tc.__name__ in ("deque", "dict_values"):
        return any(_strict_eq(x, e) for e in c)
    return x in c


def _strict_cmp(op: str, a, b) -> bool:
    """One comparison of the tests (``op``: the ast operator's name), type-strict (see :func:`_strict_eq`)."""
    if op == "Eq":
        return _strict_eq(a, b)
    if op == "NotEq":
        return not _strict_eq(a, b)
    if op == "In":
        return _strict_in(a, b)
    if op == "NotIn":
        return not _strict_in(a, b)
    if op == "Is":
        return a is b
    if op == "IsNot":
        return a is not b
    _ordered(a, b)
    a, b = _plain(a), _plain(b)
    if type(a) in (set, frozenset) and type(b) in (set, frozenset):
        a, b = {_canon(x) for x in a}, {_canon(x) for x in b}
    return a < b if op == "Lt" else a <= b if op == "LtE" else a > b if op == "Gt" else a >= b


def _strict_chain(ops: tuple, left, *rights):
    """A chained comparison ``left op0 r0 op1 r1 ...``: each right operand (a thunk) evaluated once, in order, only
    while the chain holds."""
    for op, thunk in zip(ops, rights):
        right = thunk()
        if not _strict_cmp(op, left, right):
            return False
        left = right
    return True


def _strict_rewrite(tree):
    """``tree`` (the tests', or the task's prompt's) with every comparison, wherever it is (asserts, ``if``,
    ``all(...)``, ``not a != b``, ``is True`` on a comparison's result), a call of :func:`_strict_cmp`; a chain one of
    :func:`_strict_chain`, its right operands as thunks (evaluated once, in order, while the chain holds)."""
    import ast

    class Strict(ast.NodeTransformer):
        """Each ``Compare`` node becomes a call of ``__strict_cmp__`` or ``__strict_chain__`` (the tests' namespace
        binds them to :func:`_strict_cmp` and :func:`_strict_chain`)."""

        def visit_Compare(self, node):
            self.generic_visit(node)
            ops = [type(o).__name__ for o in node.ops]
            if len(ops) == 1:
                call = ast.Call(ast.Name("__strict_cmp__", ast.Load()),
                                [ast.Constant(ops[0]), node.left, node.comparators[0]], [])
            else:
                thunks = [ast.Lambda(ast.arguments([], [], None, [], [], None, []), c) for c in node.comparators]
                call = ast.Call(ast.Name("__strict_chain__", ast.Load()),
                                [ast.Constant(tuple(ops)), node.left, *thunks], [])
            return ast.copy_location(call, node)

    return ast.fix_missing_locations(Strict().visit(tree))


def _strict_isclose(real):
    """``math.isclose`` / ``cmath.isclose`` (``real``) for the tests: a bool is close only to the same bool, and a
    value of the tests' own making is compared as the plain value it compares as (:func:`_plain`)."""
    def isclose(a, b, **kw):
        a, b = _plain(a), _plain(b)
        if type(a) is bool or type(b) is bool:  # isclose(True, 1) would hold
            return type(a) is type(b) and a is b
        return real(a, b, **kw)
    isclose.__name__ = "isclose"
    return isclose


def _strict_unittest() -> None:
    """unittest's value assertions with the tests' type-strict comparison."""
    import unittest

    tc = unittest.TestCase

    def fail(self, msg, std):
        raise self.failureException(self._formatMessage(msg, std))

    def eq(self, first, second, msg=None, *_a, **_k):
        if not _strict_eq(first, second):
            fail(self, msg, f"{first!r} != {second!r}")

    def ne(self, first, second, msg=None):
        if _strict_eq(first, second):
            fail(self, msg, f"{first!r} == {second!r}")

    def isin(self, member, container, msg=None):
        if not _strict_in(member, container):
            fail(self, msg, f"{member!r} not found in {container!r}")

    def notin(self, member, container, msg=None):
        if _strict_in(member, container):
            fail(self, msg, f"{member!r} unexpectedly found in {container!r}")

    def count_eq(self, first, second, msg=None):
        a, b = [_canon(x) for x in first], [_canon(x) for x in second]
        if len(a) != len(b) or any(a.count(x) != b.count(x) for x in a):
            fail(self, msg, "element counts differ")

    def almost(real):
        def check(self, first, second, *args, **kwargs):
            _ordered(first, second)  # no NaN, no bool for a number
            return real(self, first, second, *args, **kwargs)
        return check

    for n in ("assertEqual", "assertEquals", "assertListEqual", "assertTupleEqual", "assertDictEqual",
              "assertSetEqual", "assertSequenceEqual", "assertMultiLineEqual"):
        if hasattr(tc, n):
            setattr(tc, n, eq)
    for n in ("assertNotEqual", "assertNotEquals"):
        if hasattr(tc, n):
            setattr(tc, n, ne)
    tc.assertIn, tc.assertNotIn, tc.assertCountEqual = isin, notin, count_eq
    for n in ("assertAlmostEqual", "assertNotAlmostEqual", "assertLess", "assertLessEqual", "assertGreater",
              "assertGreaterEqual"):
        setattr(tc, n, almost(getattr(tc, n)))
