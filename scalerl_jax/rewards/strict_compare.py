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
    if t.__module__ == "builtins" and t.__name__ in ("dict_keys", "dict_items"):  # views compare as sets
        try:
            return set(v)
        except TypeError:
            return v
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


def _orderable(values, what: str) -> None:
    """Raise :class:`_Unsound` when ordering ``values`` among themselves (``max``, ``min``, ``sorted``,
    ``list.sort``) means nothing: a NaN anywhere, or a bool and a number side by side (at the top level, or in the
    same position of the sequences among them)."""
    kinds, columns = set(), []
    for v in values:
        v = _plain(v)
        t = type(v)
        if t is float and v != v or t is complex and (v.real != v.real or v.imag != v.imag):
            raise _Unsound(f"a NaN in {what}")
        if t is bool or t in (int, float):
            kinds.add(t is bool)
        elif t in (list, tuple):
            columns.extend([] for _ in range(len(v) - len(columns)))
            for i, x in enumerate(v):
                columns[i].append(x)
    if len(kinds) == 2:
        raise _Unsound(f"a bool ordered against a number in {what}")
    for col in columns:
        _orderable(col, what)


def _dict_key(d, key):
    """The key of ``d`` that ``d[key]`` should find type-strictly: ``key`` itself when the plain lookup is already
    strict (or finds nothing), the stored key of the same kind otherwise (``d[1]`` on ``{1.0: x}``); a key that
    matches only one of another kind (``d[1]`` on ``{True: x}``) raises :class:`_Unsound`."""
    tk = type(key)
    if not (tk is bool or tk in (tuple, frozenset) or tk in (int, float, complex) and key in (0, 1)):
        return key  # no other kind of key hashes and compares equal to it
    if key not in d:
        return key
    ck = _canon(key)
    for k in d:
        if _canon(k) == ck:
            return k
    raise _Unsound(f"the key {key!r} matches only a key of another type")


def _no_collision(a, b) -> None:
    """Raise :class:`_Unsound` when the set operation of ``a`` with ``b`` would merge a bool with a number (or
    tuples that differ only so): the plain operation would treat them as one element."""
    seen = {}
    for x in a:
        try:
            seen[x] = _canon(x)
        except TypeError:
            return  # unhashable: the plain operation raises as it would
    for y in b:
        try:
            c = seen.get(y)
        except TypeError:
            return
        if c is not None and c != _canon(y):
            raise _Unsound(f"{y!r} taken for an element of another type in a set operation")


def _strict_item(obj, key):
    """``obj[key]`` for the tests: a dict lookup type-strict (:func:`_dict_key`), a bool never an index."""
    if isinstance(obj, dict):
        return obj[_dict_key(obj, key)]
    if type(key) is bool and type(obj) in (list, tuple, str, bytes, range):
        raise _Unsound("a bool used as an index")
    return obj[key]


def _strict_method(obj, name: str, *args, **kwargs):
    """``obj.name(*args, **kwargs)`` for the tests: the methods of plain values that compare elements inside the
    call (``list.count`` / ``index`` / ``remove`` / ``sort``, ``dict.get`` / ``pop`` / ``setdefault``, the set
    operations) with :func:`_strict_eq`'s types; any other method as written."""
    t = type(obj)
    if t in (list, tuple) and name in ("count", "index") or t is list and name == "remove":
        if len(args) < 1 or kwargs:
            return getattr(obj, name)(*args, **kwargs)  # the method's own TypeError
        x = args[0]
        if name == "count":
            return len([e for e in obj if _strict_eq(e, x)])
        for i in range(len(obj))[slice(*(args[1:3] + (None, None))[:2])]:
            if _strict_eq(obj[i], x):
                if name == "index":
                    return i
                del obj[i]
                return None
        raise ValueError(f"{x!r} is not in {t.__name__}")
    if t is list and name == "sort" and not args:
        key, reverse = kwargs.pop("key", None), kwargs.pop("reverse", False)
        if kwargs:
            return obj.sort(**kwargs)
        keys = [key(e) for e in obj] if key is not None else list(obj)
        _orderable(keys, "list.sort()")
        obj[:] = [obj[i] for i in sorted(range(len(obj)), key=keys.__getitem__, reverse=reverse)]
        return None
    if isinstance(obj, dict) and name in ("get", "pop", "setdefault") and args:
        return getattr(obj, name)(_dict_key(obj, args[0]), *args[1:], **kwargs)
    if t in (set, frozenset) and name in ("issubset", "issuperset", "isdisjoint", "intersection", "union",
                                          "difference", "symmetric_difference"):
        args = tuple(a if type(a) in (set, frozenset, dict) else list(a) for a in args)
        for a in args:
            _no_collision(obj, a)
    return getattr(obj, name)(*args, **kwargs)


def _strict_binop(op: str, a, b):
    """One arithmetic or set operation of the tests (``op``: the ast operator's name): a bool with a number
    (``abs(f() - 1) < tol`` with ``True``) raises :class:`_Unsound`; a set operation that would merge a bool with a
    number too (:func:`_no_collision`)."""
    import operator

    ta, tb = type(a), type(b)
    if (ta is bool) != (tb is bool) and ta in (bool, int, float, complex) and tb in (bool, int, float, complex):
        raise _Unsound(f"a bool in arithmetic with a number ({(tb if ta is bool else ta).__name__})")
    if ta in (set, frozenset) and tb in (set, frozenset):
        _no_collision(a, b)
    return getattr(operator, {"Add": "add", "Sub": "sub", "Mult": "mul", "Div": "truediv", "FloorDiv": "floordiv",
                              "Mod": "mod", "Pow": "pow", "BitAnd": "and_", "BitOr": "or_", "BitXor": "xor"}[op])(a, b)


def _strict_builtins(b: dict) -> None:
    """Replace, in the tests' builtins ``b``, the builtins that compare or convert values inside the call:
    ``max`` / ``min`` / ``sorted`` refuse a NaN or a bool among numbers (:func:`_orderable`), ``sum`` a bool
    among numbers, ``abs`` / ``round`` a bool. Each key function is called once per element, as the builtins do."""
    real_max, real_min, real_sorted, real_sum, real_abs, real_round = (b[n] for n in ("max", "min", "sorted", "sum",
                                                                                        "abs", "round"))

    def pick(real):
        def chosen(*args, key=None, **kw):
            items = list(args[0]) if len(args) == 1 else list(args)
            if not args or not items:
                return real(*args, **kw) if key is None else real(*args, key=key, **kw)
            keys = items if key is None else [key(x) for x in items]
            _orderable(keys, f"{real.__name__}()")
            return items[real(range(len(items)), key=keys.__getitem__, **kw)]
        chosen.__name__ = real.__name__
        return chosen

    def strict_sorted(iterable, /, *, key=None, reverse=False):
        items = list(iterable)
        keys = items if key is None else [key(x) for x in items]
        _orderable(keys, "sorted()")
        return [items[i] for i in real_sorted(range(len(items)), key=keys.__getitem__, reverse=reverse)]

    def strict_sum(iterable, /, start=0):
        items = list(iterable)
        if len({type(x) is bool for x in items if type(x) in (bool, int, float, complex)}) == 2:
            raise _Unsound("a bool summed with numbers")
        return real_sum(items, start)

    b.update(max=pick(real_max), min=pick(real_min), sorted=strict_sorted, sum=strict_sum, abs=_no_bool(real_abs),
             round=_no_bool(real_round))


def _no_bool(real):
    """``real`` (a numeric function: ``abs``, ``round``, ``math.fabs``...) refusing a bool for its argument."""
    def call(x, *args, **kw):
        if type(x) is bool:
            raise _Unsound(f"{real.__name__}() of a bool")
        return real(x, *args, **kw)
    call.__name__ = real.__name__
    return call


def _strict_unary(op: str, a):
    """``-a`` / ``+a`` / ``~a`` for the tests: a bool is not a number here either."""
    if type(a) is bool:
        raise _Unsound("a bool negated as a number")
    return -a if op == "USub" else +a if op == "UAdd" else ~a


def _strict_names() -> dict:
    """The names the rewritten tests call (:func:`_strict_rewrite`), bound to their helpers."""
    return {"__strict_cmp__": _strict_cmp, "__strict_chain__": _strict_chain, "__strict_item__": _strict_item,
            "__strict_method__": _strict_method, "__strict_binop__": _strict_binop, "__strict_unary__": _strict_unary}


def _strict_rewrite(tree):
    """``tree`` (the tests', or the task's prompt's) with every comparison, wherever it is (asserts, ``if``,
    ``all(...)``, ``not a != b``, ``is True`` on a comparison's result), a call of :func:`_strict_cmp`; a chain one of
    :func:`_strict_chain`, its right operands as thunks (evaluated once, in order, while the chain holds). Reads
    ``x[k]`` go through :func:`_strict_item`, the element-comparing methods of plain values through
    :func:`_strict_method`, arithmetic and set operators through :func:`_strict_binop` (augmented assignments such
    as ``n += a == b`` stay as written), unary ``-`` / ``+`` / ``~`` through :func:`_strict_unary`."""
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

        def visit_Subscript(self, node):
            self.generic_visit(node)
            if not isinstance(node.ctx, ast.Load):
                return node
            return ast.copy_location(ast.Call(ast.Name("__strict_item__", ast.Load()), [node.value, node.slice], []),
                                     node)

        def visit_Call(self, node):
            self.generic_visit(node)
            f = node.func
            if not (isinstance(f, ast.Attribute) and f.attr in methods):
                return node
            return ast.copy_location(ast.Call(ast.Name("__strict_method__", ast.Load()),
                                              [f.value, ast.Constant(f.attr), *node.args], node.keywords), node)

        def visit_BinOp(self, node):
            self.generic_visit(node)
            op = type(node.op).__name__
            if op not in binops:
                return node
            return ast.copy_location(ast.Call(ast.Name("__strict_binop__", ast.Load()),
                                              [ast.Constant(op), node.left, node.right], []), node)

        def visit_UnaryOp(self, node):
            self.generic_visit(node)
            if isinstance(node.op, ast.Not):
                return node
            return ast.copy_location(ast.Call(ast.Name("__strict_unary__", ast.Load()),
                                              [ast.Constant(type(node.op).__name__), node.operand], []), node)

    methods = {"count", "index", "remove", "sort", "get", "pop", "setdefault", "issubset", "issuperset",
               "isdisjoint", "intersection", "union", "difference", "symmetric_difference"}
    binops = {"Add", "Sub", "Mult", "Div", "FloorDiv", "Mod", "Pow", "BitAnd", "BitOr", "BitXor"}
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
