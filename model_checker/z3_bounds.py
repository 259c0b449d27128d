"""Per-step bounds on the Z3 encoding's variables, to which BMC narrows each step's variables.

`step_bounds(enc, depth)` gives, for t = 0 .. depth, an interval per variable (a Bool as 0 =
False, 1 = True) holding its value in every state reachable from `init` within t steps; None when
it cannot show them. It is a non-relational abstract interpretation of the transition template
(`Encoding._rules_on`): step t+1's bounds are step t's joined with, for each action instance whose
guard can hold within step t's bounds, the values its updates can take within them.

Guards and updates are evaluated over the bounds: an integer expression as an interval (every
subexpression must stay in the bit-vectors' signed range, so bit-vector arithmetic on it is integer
arithmetic), a Boolean one as the truth values it can take; an `ite` takes only the branches its
condition allows. A guard's top-level conjuncts also narrow the bounds its instance's updates are
evaluated in: a Bool variable or its negation, a comparison of an integer variable with a
constant or an expression (`net > 0` keeps `net - 1` non-negative; `p_wrote < target`), and an
upper bound on a sum of variables (the fault budget). An integer expression it does not understand
makes it answer None; a Boolean one can be either truth value.

Two refinements make the bounds tight enough to matter:

* Firing counts (`_Counts`): how often each instance can fire within t steps, from its guard (a
  phase it leaves, a flag it sets, the fault budget, the messages there are to receive); a
  counter is then at most its largest set value plus what the instances adding to it can add.
* Parts: the states are split by the values of the fault budget's counters and of the counters
  that only faults advance (the epochs), with bounds per part (`_parts`): a path that spent the
  budget on one fault cannot take another, which bounds of all states together cannot tell
  (with one fault, a request cancelled early lets the next one start early, but then no fault is
  left to end that one early). The parts are split, too, by the Bools that once true stay true
  and that guards of other instances read (`_flags`: the router's `submitted` and `ans_set`), so
  the bounds relate the requests: in a part where a request is not submitted its fields keep their
  initial values, and a part where it is appears only after the steps its predecessors need to be
  answered (with one request active at a time, the third request of the sequential scenario cannot
  be submitted within 10 steps, where bounds of all states together let it in at step 6). Past
  `_MAX_PARTS` parts, the split by flags is dropped (the parts joined) for the remaining steps.

The bounds are what makes BMC fast: besides fewer SAT variables, they tell the solver what no
path of t steps can reach (a request that cannot be submitted yet, a message that cannot have
been sent), which it would otherwise have to rediscover at every step of every unrolling.
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING, Any

import z3

if TYPE_CHECKING:
    from kvhandoff.model_checker.z3_encoding import Encoding

Bounds = dict[str, tuple[int, int]]

_FALSE, _TRUE, _EITHER = 1, 2, 3
"""A Boolean expression's possible truth values, as a bit set."""

_COMPARE = {
    z3.Z3_OP_SLT: ("lt", False, True),
    z3.Z3_OP_SLEQ: ("lt", False, False),
    z3.Z3_OP_SGT: ("lt", True, True),
    z3.Z3_OP_SGEQ: ("lt", True, False),
}
"""Signed comparisons as ("lt", swap the arguments, strict)."""


class _Compiler:
    """Z3 terms of the template as plain tuples, each compiled once, through Z3's C API (walking
    terms with the Python objects was most of the analysis' time).

    Integers: ("n", value) | ("v", name) | ("ite", cond, a, b) | ("+", args) | ("-", a, b) | None
    (not understood). Booleans: ("c", bits) | ("b", name) | ("and", args) | ("or", args) |
    ("not", a) | ("eq", a, b) (integers) | ("iff", a, b) | ("lt", a, b, strict) |
    ("bite", cond, a, b) | ("?",) (not understood: either truth value)."""

    def __init__(self, ints: dict[int, str], bools: dict[int, str], ctx: Any) -> None:
        self.ints, self.bools = ints, bools
        self.ref = ctx.ref()
        self.done: dict[int, Any] = {}

    def __call__(self, e: Any) -> Any:
        return self.ast(e.as_ast())

    def ast(self, a: Any) -> Any:
        key = z3.Z3_get_ast_id(self.ref, a)
        if key not in self.done:
            self.done[key] = self._compile(a, key)
        return self.done[key]

    def _compile(self, a: Any, key: int) -> Any:
        c = self.ref
        sort = z3.Z3_get_sort(c, a)
        is_bool = z3.Z3_get_sort_kind(c, sort) == z3.Z3_BOOL_SORT
        if key in self.bools:
            return ("b", self.bools[key])
        if key in self.ints:
            return ("v", self.ints[key])
        kind = z3.Z3_get_ast_kind(c, a)
        if kind == z3.Z3_NUMERAL_AST and not is_bool:
            value = int(z3.Z3_get_numeral_string(c, a))
            width = z3.Z3_get_bv_sort_size(c, sort)
            return ("n", value - (1 << width) if value >> (width - 1) else value)
        if kind != z3.Z3_APP_AST:
            return ("?",) if is_bool else None
        app = z3.Z3_to_app(c, a)
        op = z3.Z3_get_decl_kind(c, z3.Z3_get_app_decl(c, app))
        args = [z3.Z3_get_app_arg(c, app, i) for i in range(z3.Z3_get_app_num_args(c, app))]
        if is_bool:
            if op == z3.Z3_OP_TRUE or op == z3.Z3_OP_FALSE:
                return ("c", _TRUE if op == z3.Z3_OP_TRUE else _FALSE)
            if op == z3.Z3_OP_AND or op == z3.Z3_OP_OR:
                return ("and" if op == z3.Z3_OP_AND else "or", [self.ast(x) for x in args])
            if op == z3.Z3_OP_NOT:
                return ("not", self.ast(args[0]))
            if op == z3.Z3_OP_IMPLIES:
                return ("or", [("not", self.ast(args[0])), self.ast(args[1])])
            if op == z3.Z3_OP_ITE:
                return ("bite", *[self.ast(x) for x in args])
            if op in (z3.Z3_OP_EQ, z3.Z3_OP_DISTINCT) and len(args) == 2:
                inner = z3.Z3_get_sort_kind(c, z3.Z3_get_sort(c, args[0])) == z3.Z3_BOOL_SORT
                pair = ("iff" if inner else "eq", self.ast(args[0]), self.ast(args[1]))
                return pair if op == z3.Z3_OP_EQ else ("not", pair)
            if op in _COMPARE:
                _, swap, strict = _COMPARE[op]
                x, y = (args[1], args[0]) if swap else (args[0], args[1])
                return ("lt", self.ast(x), self.ast(y), strict)
            return ("?",)
        if op == z3.Z3_OP_ITE:
            return ("ite", *[self.ast(x) for x in args])
        if op == z3.Z3_OP_BADD:  # flattened: `z3.Sum` nests binary additions
            terms = [self.ast(x) for x in args]
            return ("+", [u for t in terms for u in (t[1] if t and t[0] == "+" else [t])])
        if op == z3.Z3_OP_BSUB and len(args) == 2:
            return ("-", self.ast(args[0]), self.ast(args[1]))
        return None


def _conjuncts(node: Any) -> list[Any]:
    """A compiled Boolean term's top-level conjuncts."""
    out, todo = [], [node]
    while todo:
        x = todo.pop()
        if x[0] == "and":
            todo.extend(x[1])
        else:
            out.append(x)
    return out


class _Eval:
    """Evaluation of compiled terms over bounds (`env`, overridden by `met`), memoised."""

    def __init__(self, env: Bounds, met: Bounds, top: int) -> None:
        self.env, self.met, self.top = env, met, top
        self.memo: dict[int, Any] = {}

    def var(self, name: str) -> tuple[int, int]:
        got = self.met.get(name)
        return got if got is not None else self.env[name]

    def bits(self, node: Any) -> int:
        """The truth values a Boolean term can take."""
        key = id(node)
        out = self.memo.get(key)
        if out is None:
            out = self._bits(node)
            self.memo[key] = out
        return int(out)

    def _bits(self, node: Any) -> int:
        tag = node[0]
        if tag == "b":
            lo, hi = self.var(node[1])
            return (_FALSE if lo == 0 else 0) | (_TRUE if hi == 1 else 0)
        if tag == "c":
            return int(node[1])
        if tag == "and" or tag == "or":
            parts = [self.bits(a) for a in node[1]]
            if tag == "and":
                true = all(p & _TRUE for p in parts)
                false = any(p & _FALSE for p in parts)
            else:
                true = any(p & _TRUE for p in parts)
                false = all(p & _FALSE for p in parts)
            return (_TRUE if true else 0) | (_FALSE if false else 0)
        if tag == "not":
            p = self.bits(node[1])
            return ((p & _TRUE) and _FALSE) | ((p & _FALSE) and _TRUE)
        if tag == "iff":
            a, b = self.bits(node[1]), self.bits(node[2])
            if a == _EITHER or b == _EITHER:
                return _EITHER
            return _TRUE if a == b else _FALSE
        if tag == "bite":
            c = self.bits(node[1])
            return (self.bits(node[2]) if c & _TRUE else 0) | (
                self.bits(node[3]) if c & _FALSE else 0
            )
        if tag == "eq" or tag == "lt":
            x, y = self.interval(node[1]), self.interval(node[2])
            if x is None or y is None:
                return _EITHER
            if tag == "eq":
                true = x[0] <= y[1] and y[0] <= x[1]
                false = not (x[0] == x[1] == y[0] == y[1])
            elif node[3]:  # x < y
                true, false = x[0] < y[1], x[1] >= y[0]
            else:  # x <= y
                true, false = x[0] <= y[1], x[1] > y[0]
            return (_TRUE if true else 0) | (_FALSE if false else 0)
        return _EITHER

    def interval(self, node: Any) -> tuple[int, int] | None:
        """The values an integer term can take; None when not understood or it could wrap."""
        if node is None:
            return None
        key = id(node)
        if key in self.memo:
            out: tuple[int, int] | None = self.memo[key]
            return out
        out = self._interval(node)
        if out is not None and not (-self.top <= out[0] and out[1] < self.top):
            out = None  # could wrap around: not understood
        self.memo[key] = out
        return out

    def _interval(self, node: Any) -> tuple[int, int] | None:
        tag = node[0]
        if tag == "n":
            return node[1], node[1]
        if tag == "v":
            return self.var(node[1])
        if tag == "ite":
            c = self.bits(node[1])
            a = self.interval(node[2]) if c & _TRUE else None
            b = self.interval(node[3]) if c & _FALSE else None
            if (c & _TRUE and a is None) or (c & _FALSE and b is None):
                return None
            if a is None:
                return b
            if b is None:
                return a
            return min(a[0], b[0]), max(a[1], b[1])
        if tag == "+":
            parts = [self.interval(a) for a in node[1]]
            known = [p for p in parts if p is not None]
            if len(known) < len(parts):
                return None
            return sum(p[0] for p in known), sum(p[1] for p in known)
        a, b = self.interval(node[1]), self.interval(node[2])
        if a is None or b is None:
            return None
        return a[0] - b[1], a[1] - b[0]


def _facts(guard: Any) -> list[tuple[str, Any, Any]]:
    """A compiled guard's top-level conjuncts that bound variables: ("lo" | "hi", name, value or
    term), ("sum", names, value) (a sum of variables at most `value`), ("is", name, 0 | 1)."""
    out: list[tuple[str, Any, Any]] = []
    for node in _conjuncts(guard):
        if node[0] == "b":
            out.append(("is", node[1], 1))
        elif node[0] == "not" and node[1][0] == "b":
            out.append(("is", node[1][1], 0))
        elif node[0] == "eq" and node[1] and node[1][0] == "v" and node[2] and node[2][0] == "n":
            out += [("lo", node[1][1], node[2][1]), ("hi", node[1][1], node[2][1])]
        elif node[0] == "lt":
            a, b, strict = node[1], node[2], node[3]
            if a is not None and a[0] == "v" and b is not None:  # v < b
                bound = b[1] - strict if b[0] == "n" else ("-", b, ("n", int(strict)))
                out.append(("hi", a[1], bound))
            elif b is not None and b[0] == "v" and a is not None and a[0] == "n":  # a < v
                out.append(("lo", b[1], a[1] + strict))
            elif a is not None and a[0] == "+" and b is not None and b[0] == "n":
                # `z3.Sum` starts from the constant 0.
                if all(t is not None and t[0] in ("v", "n") for t in a[1]):
                    names = [t[1] for t in a[1] if t[0] == "v"]
                    offset = sum(t[1] for t in a[1] if t[0] == "n")
                    out.append(("sum", names, b[1] - strict - offset))
    return out


def _meet(facts: list[tuple[str, Any, Any]], env: Bounds, top: int) -> Bounds | None:
    """The bounds of the variables a guard's facts constrain, met with them; None when no value
    within the bounds meets them."""
    out: Bounds = {}
    for tag, name, bound in facts:
        if tag == "sum":
            ivs = [out.get(n, env[n]) for n in name]
            if sum(iv[1] for iv in ivs) >= top or sum(iv[0] for iv in ivs) < -top:
                continue  # the sum could wrap around: no bound from it
            least = sum(iv[0] for iv in ivs)
            for n, (lo, hi) in zip(name, ivs, strict=True):
                out[n] = (lo, min(hi, bound - (least - lo)))
            continue
        if not isinstance(bound, int):
            most = _Eval(env, out, top).interval(bound)
            if most is None:
                continue
            bound = most[1]
        lo, hi = out.get(name, env[name])
        if tag == "lo":
            lo = max(lo, bound)
        elif tag == "hi":
            hi = min(hi, bound)
        else:
            lo, hi = max(lo, bound), min(hi, bound)
        out[name] = (lo, hi)
    if any(lo > hi for lo, hi in out.values()):
        return None
    return out


def _leaves(node: Any, var: str) -> list[tuple[Any, ...]]:
    """What an update does to `var`, leaf by leaf of its `ite` tree: ("add", k) for `var + k`
    (k = 0: unchanged), ("set", node) for any other value; for a Bool also ("or",) / ("and",)
    for `Or(var, ...)` / `And(var, ...)`."""
    if node is not None and node[0] in ("ite", "bite"):
        return _leaves(node[2], var) + _leaves(node[3], var)
    if node is None:
        return [("set", None)]
    if node == ("v", var) or node == ("b", var):
        return [("add", 0)]
    if node[0] == "+":
        # `ite(c, a, b) + k` is `a + k` or `b + k`: an update that adds under a condition to a
        # value an earlier update chose (two sends of one slot in a step) still only adds.
        for i, a in enumerate(node[1]):
            if a is not None and a[0] == "ite":
                rest = node[1][:i] + node[1][i + 1 :]
                return _leaves(_sum([a[2], *rest]), var) + _leaves(_sum([a[3], *rest]), var)
        mine = [a for a in node[1] if a == ("v", var)]
        rest = [a for a in node[1] if a != ("v", var)]
        if len(mine) == 1 and all(a is not None and a[0] == "n" for a in rest):
            return [("add", sum(a[1] for a in rest))]
    if node[0] == "-" and node[1] == ("v", var) and node[2] is not None and node[2][0] == "n":
        return [("add", -node[2][1])]
    if node[0] in ("or", "and") and ("b", var) in node[1]:
        return [(node[0],)]
    return [("set", node)]


def _sum(terms: list[Any]) -> Any:
    """("+", terms), nested sums flattened (as `_Compiler` flattens them)."""
    return ("+", [u for t in terms for u in (t[1] if t and t[0] == "+" else [t])])


def _constant(leaf: tuple[Any, ...]) -> int | None:
    """The value a leaf sets its variable to, when a constant (a Bool as 0 / 1)."""
    if leaf[0] == "set" and leaf[1] is not None:
        if leaf[1][0] == "n":
            return int(leaf[1][1])
        if leaf[1][0] == "c" and leaf[1][1] in (_TRUE, _FALSE):
            return 1 if leaf[1][1] == _TRUE else 0
    return None


def _membership(node: Any) -> tuple[str, set[int]] | None:
    """`x in S` for a conjunct `b`, `Not(b)`, `x == c` or `Or(x == c1, x == c2, ...)`."""
    if node[0] == "b":
        return node[1], {1}
    if node[0] == "not" and node[1][0] == "b":
        return node[1][1], {0}
    parts = node[1] if node[0] == "or" else [node]
    name, values = None, set()
    for p in parts:
        if not (p[0] == "eq" and p[1] and p[1][0] == "v" and p[2] and p[2][0] == "n"):
            return None
        if name not in (None, p[1][1]):
            return None
        name = p[1][1]
        values.add(p[2][1])
    return (name, values) if name is not None else None


class _Counts:
    """Bounds on how often each instance can fire within t steps, F_i(t): at most t, at most one
    more than within t-1 steps (none more if its guard cannot hold within the step-(t-1) bounds),
    and, from its guard:

    * `x in S` (a phase test, a Bool flag) where the instance always moves x out of S: at most
      [x_0 in S] plus how often other instances can move x into S;
    * `x != y` where it sets x to y: at most [x_0 != y_0] plus the firings that change x or y;
    * `v_1 + ... + v_m <= h` where it always increases the sum and no instance ever decreases a
      v_k: the instances with that conjunct fire at most h - (v_1 + ... + v_m)_0 + 1 times in
      all (the fault budget);
    * `v >= l` where it always decreases v, every decrease of v is guarded so that v stays
      non-negative and nothing sets v otherwise: all such instances together fire at most v_0
      plus the increments of v (a message is received at most as often as it was sent).

    An integer is then at most its largest initial or set value plus the increments of the
    instances that add to it, times their counts (`most`)."""

    def __init__(self, programs: list[Any], initial: dict[str, int]) -> None:
        self.n = len(programs)
        self.effects: list[dict[str, list[tuple[Any, ...]]]] = [
            {name: _leaves(node, name) for name, node, _ in updates} for _, _, updates in programs
        ]
        # (i, base, others): F_i <= base + the firings of `others`.
        self.single: list[tuple[int, int, dict[int, int]]] = []
        self._relevant: dict[frozenset[int], list[int]] = {}
        budgets: dict[tuple[frozenset[str], int], set[int]] = {}
        consumers: dict[str, set[int]] = {}
        for i, (facts, guard, _) in enumerate(programs):
            eff = self.effects[i]
            for node in _conjuncts(guard):
                member = _membership(node)
                if member is not None:
                    x, values = member
                    sets = [_constant(lf) for lf in eff.get(x, [("add", 0)])]
                    if all(c is not None and c not in values for c in sets):
                        others = [j for j in range(self.n) if j != i and self._enters(j, x, values)]
                        self.single.append((i, int(initial[x] in values), dict.fromkeys(others, 1)))
                if node[0] == "not" and node[1][0] == "eq":
                    x, y = node[1][1], node[1][2]
                    if x and y and x[0] == "v" and y[0] == "v" and y[1] not in eff:
                        if eff.get(x[1]) == [("set", y)]:
                            others = [
                                j for j in range(self.n) if {x[1], y[1]} & set(self.effects[j])
                            ]
                            others = [j for j in others if j != i]
                            base = int(initial[x[1]] != initial[y[1]])
                            self.single.append((i, base, dict.fromkeys(others, 1)))
            for tag, name, bound in facts:
                if tag in ("hi", "sum") and isinstance(bound, int):
                    names = frozenset(name if tag == "sum" else [name])
                    if any(
                        all(lf[0] == "add" and lf[1] >= 1 for lf in eff[v])
                        for v in names
                        if v in eff
                    ):
                        budgets.setdefault((names, bound), set()).add(i)
                elif tag == "lo" and isinstance(bound, int) and bound >= 1 and name in eff:
                    if all(lf[0] == "add" and lf[1] <= -1 for lf in eff[name]):
                        consumers.setdefault(name, set()).add(i)
        self.budgets: list[tuple[set[int], int]] = []
        for (names, high), members in budgets.items():
            if all(self._never_decreases(v) for v in names):
                self.budgets.append((members, max(0, high - sum(initial[v] for v in names) + 1)))
        self.consumers: list[tuple[set[int], int, dict[int, int]]] = []
        for v, members in consumers.items():
            supply: dict[int, int] = {}
            ok = initial[v] >= 0
            for j in range(self.n):
                leaves = self.effects[j].get(v, [])
                if any(lf[0] != "add" for lf in leaves):
                    ok = False  # some instance sets it outright: no consumer count
                    break
                drop = -min((lf[1] for lf in leaves), default=0)
                guarded = any(
                    t == "lo" and n == v and isinstance(b, int) and b >= drop
                    for t, n, b in programs[j][0]
                )
                if drop > 0 and not guarded:
                    ok = False
                rise = max((lf[1] for lf in leaves), default=0)
                if rise > 0:
                    supply[j] = rise
            if ok:
                self.consumers.append((members, initial[v], supply))

    def _enters(self, j: int, x: str, values: set[int]) -> bool:
        """Whether instance j can move x into `values`."""
        for lf in self.effects[j].get(x, []):
            c = _constant(lf)
            if c is not None:
                if c in values:
                    return True
            elif lf[0] == "add":
                if lf[1] != 0:
                    return True
            elif lf[0] == "or" or lf[0] == "and":
                if (1 if lf[0] == "or" else 0) in values:
                    return True
            else:
                return True
        return False

    def _never_decreases(self, v: str) -> bool:
        return all(lf[0] == "add" and lf[1] >= 0 for eff in self.effects for lf in eff.get(v, []))

    def cap(
        self, weights: dict[int, int], fires: list[int], groups: list[tuple[set[int], int]]
    ) -> int:
        """An upper bound on the sum of w_j * F_j, using the group bounds where smaller."""
        if not weights:
            return 0
        key = frozenset(weights)
        relevant = self._relevant.get(key)
        if relevant is None:  # the groups' members do not change, only their bounds
            relevant = [k for k, (members, _) in enumerate(groups) if members & key]
            self._relevant[key] = relevant
        left = dict(weights)
        total = 0
        for k in relevant:
            members, bound = groups[k]
            inter = [j for j in left if j in members]
            if not inter:
                continue
            alone = sum(left[j] * fires[j] for j in inter)
            together = max(left[j] for j in inter) * bound
            if together < alone:
                total += together
                for j in inter:
                    del left[j]
        return total + sum(w * fires[j] for j, w in left.items())

    def step(
        self, t: int, before: list[int], enabled: list[bool]
    ) -> tuple[list[int], list[tuple[set[int], int]]]:
        """F(t) from F(t-1) and which instances can fire at step t."""
        f = [min(t, before[i] + int(enabled[i])) for i in range(self.n)]
        while True:
            groups = list(self.budgets)
            for members, start, supply in self.consumers:
                groups.append((members, start + self.cap(supply, f, self.budgets)))
            new = list(f)
            for members, bound in groups:
                for i in members:
                    new[i] = min(new[i], bound)
            for i, base, others in self.single:
                new[i] = min(new[i], base + self.cap(others, new, groups))
            if new == f:
                return f, groups
            f = new


def _parts(
    programs: list[Any], counts: _Counts, initial: dict[str, int]
) -> tuple[list[str], int, int, list[set[tuple[int, ...]]]] | None:
    """How to split states: by the values of the counters of the most common upper bound on a
    sum in the guards (the fault budget: `f.crashes + ... + f.prefill_aborts`), when no instance
    ever decreases them or sets them otherwise, and of the counters that only instances spending
    that budget change (the epochs, which only restarts advance). Returns those counters (the
    budget's first), how many of them the budget has, its bound, and per instance the amounts it
    can add to each."""
    found: dict[tuple[frozenset[str], int], int] = {}
    for facts, _, _ in programs:
        for tag, names, bound in facts:
            if tag == "sum":
                key = (frozenset(names), bound)
                found[key] = found.get(key, 0) + 1
    if not found:
        return None
    names, bound = max(found, key=lambda k: found[k])
    budget = sorted(names)

    def amounts(eff: dict[str, list[tuple[Any, ...]]], order: list[str]) -> set[tuple[int, ...]]:
        out: set[tuple[int, ...]] = {()}
        for v in order:
            leaves = eff.get(v, [("add", 0)])
            out = {(*a, lf[1]) for a in out for lf in leaves}
        return out

    def monotone(v: str) -> bool:
        return initial[v] >= 0 and all(
            lf[0] == "add" and lf[1] >= 0 for eff in counts.effects for lf in eff.get(v, [])
        )

    if not all(monotone(v) for v in budget):
        return None
    spends = [min(sum(a) for a in amounts(eff, budget)) >= 1 for eff in counts.effects]
    extra = sorted(
        v
        for v in initial
        if v not in names
        and any(v in eff for eff in counts.effects)
        and monotone(v)
        and all(spends[i] for i, eff in enumerate(counts.effects) if v in eff)
    )
    order = budget + extra
    return order, len(budget), bound, [amounts(eff, order) for eff in counts.effects]


def _flags(programs: list[Any], counts: _Counts, bools: set[str]) -> list[str]:
    """The Bools to split states by as well: those that, once true, stay true (every update sets
    them true, `Or`s them or leaves them), and that some instance's guard reads without that
    instance setting them (the router's `submitted` and `ans_set`: in-order submission, the
    active count). Splitting by them keeps per part what they relate: a request not submitted
    yet keeps its initial values, and reaching a part where it is takes as many steps as the
    parts before it need to set their flags (the other requests answered)."""

    def monotone(v: str) -> bool:
        return all(
            lf == ("add", 0) or lf == ("or",) or _constant(lf) == 1
            for eff in counts.effects
            for lf in eff.get(v, [])
        )

    guarded: set[str] = set()
    for i, (_, guard, _updates) in enumerate(programs):
        guarded |= _reads([guard]) - set(counts.effects[i])
    return sorted(v for v in bools if v in guarded and monotone(v))


def _reads(nodes: list[Any]) -> set[str]:
    """The variables compiled terms read."""
    out: set[str] = set()
    todo = list(nodes)
    while todo:
        x = todo.pop()
        if not isinstance(x, tuple) or not x:
            if isinstance(x, list):
                todo.extend(x)
            continue
        if x[0] in ("v", "b"):
            out.add(x[1])
        else:
            todo.extend(x[1:])
    return out


class _Result:
    """One instance's guard and updates evaluated over one part's bounds: `ev` None when the
    guard cannot hold; `succ` (the updated variables' bounds), `adds` (the most it adds to a
    counter) and `sets` (the most it sets an integer to) once `update` ran."""

    def __init__(self, env: Bounds, facts: list[tuple[str, Any, Any]], guard: Any, top: int):
        met = _meet(facts, env, top)
        self.ev: _Eval | None = None if met is None else _Eval(env, met, top)
        if self.ev is not None and not self.ev.bits(guard) & _TRUE:
            self.ev = None
        self.succ: Bounds | None = None
        self.adds: dict[str, int] = {}
        self.sets: dict[str, int] = {}

    def update(
        self, updates: list[Any], effects: dict[str, list[tuple[Any, ...]]], initial: dict[str, int]
    ) -> bool:
        """Evaluate the updates; False when an integer update is not understood."""
        ev = self.ev
        assert ev is not None
        succ: Bounds = {}
        for name, node, is_bool in updates:
            if is_bool:
                b = ev.bits(node)
                succ[name] = (0 if b & _FALSE else 1, 1 if b & _TRUE else 0)
                continue
            iv = ev.interval(node)
            if iv is None:
                return False
            succ[name] = iv
            for lf in effects[name]:
                if lf[0] == "add" and lf[1] > 0:
                    self.adds[name] = max(self.adds.get(name, 0), lf[1])
                elif lf[0] == "set":
                    most = ev.interval(lf[1])
                    high = ev.top if most is None else most[1]
                    self.sets[name] = max(self.sets.get(name, initial[name]), high)
        self.succ = succ
        return True


def _join(a: Bounds, b: Bounds) -> Bounds:
    return {n: (min(lo, b[n][0]), max(hi, b[n][1])) for n, (lo, hi) in a.items()}


_MAX_PARTS = 48
"""Beyond this many parts, `step_bounds` stops splitting by `_flags` (the analysis' time grows
with the parts: requests submitted in any order, several at a time, give hundreds)."""


def step_bounds(enc: Encoding, depth: int) -> list[Bounds] | None:
    """The bounds of steps 0 .. depth (module docstring), or None when not shown."""
    assert enc.width is not None
    top = 2 ** (enc.width - 1)
    s = enc.state_at(0, "tpl_")
    ints = {s[n].get_id(): n for n, kind in enc.fields if kind == "I"}
    bools = {s[n].get_id(): n for n, kind in enc.fields if kind == "B"}
    int_names = set(ints.values())
    compile_ = _Compiler(ints, bools, s[enc.fields[0][0]].ctx)
    programs = []
    for guard, new in enc._rules_on(s):
        updates = []
        for name, value in new.items():
            node = compile_(value)
            if node != ("v", name) and node != ("b", name):  # else unchanged
                updates.append((name, node, name in bools.values()))
        compiled = compile_(guard)
        programs.append((_facts(compiled), compiled, updates))
    initial = {n: enc.initial(n) for n in int_names} | dict.fromkeys(bools.values(), 0)
    counts = _Counts(programs, initial)
    split = _parts(programs, counts, initial)
    # A part: the values of the counters `split` names, or None past the budget's bound + 1.
    order, spent_of, bound = (split[0], split[1], split[2]) if split else ([], 0, 0)
    flags = _flags(programs, counts, set(bools.values()))
    counters = len(order)

    def part(values: tuple[int, ...]) -> tuple[int, ...] | None:
        return None if split and sum(values[:spent_of]) > bound + 1 else values

    def targets(p: tuple[int, ...] | None, i: int, succ: Bounds) -> set[tuple[int, ...] | None]:
        """The parts instance i's successors of part p can lie in."""
        if p is None:
            return {None}
        options = [
            range(succ[v][0], succ[v][1] + 1) if v in succ else (p[counters + k],)
            for k, v in enumerate(flags)
        ]
        out: set[tuple[int, ...] | None] = set()
        for d in split[3][i] if split else {()}:
            q = part(tuple(a + b for a, b in zip(p[:counters], d, strict=True)))
            if q is None:
                out.add(None)
            else:
                out.update(q + values for values in itertools.product(*options))
        return out

    env: Bounds = {n: (initial[n],) * 2 for n in initial}
    first = part(tuple(initial[v] for v in order))
    assert first is not None
    start = first + tuple(initial[v] for v in flags)
    order = order + flags
    parts: dict[tuple[int, ...] | None, Bounds] = {start: env}
    steps = [env]
    fires = [0] * len(programs)
    reads = [_reads([guard, *[node for _, node, _ in updates]]) for _, guard, updates in programs]
    for i, (facts, _, _) in enumerate(programs):
        for f in facts:
            reads[i] |= set(f[1]) if f[0] == "sum" else {f[1]}
            if not isinstance(f[2], int):
                reads[i] |= _reads([f[2]])
    # Per part and instance, what it gave at the last step: an instance that reads nothing
    # whose bounds changed since gives the same again (the part's bounds only grow).
    memo: dict[tuple[tuple[int, ...] | None, int], _Result] = {}
    before: dict[tuple[int, ...] | None, Bounds] = {}
    while len(steps) <= depth:
        results: list[list[tuple[tuple[int, ...] | None, _Result]]] = [[] for _ in programs]
        for p, penv in parts.items():
            old = before.get(p)
            changed = None if old is None else {n for n, iv in penv.items() if old[n] != iv}
            for i, (facts, guard, _) in enumerate(programs):
                got = memo.get((p, i))
                if got is None or changed is None or reads[i] & changed:
                    got = _Result(penv, facts, guard, top)
                    if (
                        split
                        and p is None
                        and any(
                            f[0] == "sum"
                            and set(f[1]) == set(order[:spent_of])
                            and f[2] <= bound + 1
                            for f in facts
                        )
                    ):
                        got.ev = None  # this part has spent more of the budget than allowed
                    memo[(p, i)] = got
                if got.ev is not None:
                    results[i].append((p, got))
        before = parts
        fires, groups = counts.step(len(steps), fires, [bool(r) for r in results])
        adds: dict[str, dict[int, int]] = {}
        sets: dict[str, int] = {}
        new_parts = {p: dict(penv) for p, penv in parts.items()}
        for i, (_, _, updates) in enumerate(programs):
            if fires[i] == 0:
                continue  # cannot fire within this many steps
            for p, got in results[i]:
                fresh = got.succ is None
                if fresh and not got.update(updates, counts.effects[i], initial):
                    return None
                assert got.ev is not None and got.succ is not None
                for name, k in got.adds.items():
                    mine = adds.setdefault(name, {})
                    mine[i] = max(mine.get(i, 0), k)
                for name, high in got.sets.items():
                    sets[name] = max(sets.get(name, initial[name]), high)
                for q in targets(p, i, got.succ):
                    if q == p and not fresh:
                        continue  # already joined into this part
                    if q not in new_parts:
                        new_parts[q] = {**parts[p], **got.succ}
                        continue
                    target = new_parts[q]
                    for name, iv in (got.succ if q == p else {**parts[p], **got.succ}).items():
                        lo, hi = target[name]
                        if iv[0] < lo or iv[1] > hi:
                            target[name] = (min(lo, iv[0]), max(hi, iv[1]))
        cap = {}
        for name in int_names:
            most = max(initial[name], sets.get(name, initial[name]))
            cap[name] = most + counts.cap(adds.get(name, {}), fires, groups)
        for q, penv in new_parts.items():
            for name in int_names:
                lo, hi = penv[name]
                penv[name] = (lo, min(hi, cap[name]))
            if q is not None:  # the part's counters are exact
                penv.update({v: (value, value) for v, value in zip(order, q, strict=True)})
        parts = new_parts
        if flags and len(parts) > _MAX_PARTS:
            # Too many parts (requests submitted in any order, several at a time): split by
            # the counters alone from here on, joining the parts that differ in flags only.
            merged: dict[tuple[int, ...] | None, Bounds] = {}
            for q, penv in parts.items():
                key = None if q is None else q[:counters]
                merged[key] = penv if key not in merged else _join(merged[key], penv)
            parts, flags, order = merged, [], order[:counters]
            start = start[:counters]
            memo, before = {}, {}
        env = parts[start]
        for penv in parts.values():
            env = _join(env, penv)
        if any(lo < enc.minimum(n) or hi >= top for n, (lo, hi) in env.items() if n in int_names):
            return None
        steps.append(env)
    return steps
