"""Finite groups as multiplication tables, for the prefix-product (word-problem) tasks.

The LRT paper's appendix "Non-Commutative State Tracking" trains on prefix products over A5, the
smallest non-solvable group (order 60), and uses the cyclic group Z60 (same 60-way output space, but
commutative) as a control. Word-problem papers add more 60-element controls: A4 x Z5 (non-abelian
but solvable) and the dihedral group D30; S5 (order 120) is the other classic non-solvable case.
Every group here is only what the tasks need: element ids 0..order-1, a multiplication table, the
identity id and the inverses.

Permutation convention (used by `symmetric`, `alternating`, `dihedral`): an element is a tuple
`p` with `p[i]` the image of point i, and the product is function composition, apply the RIGHT
factor first:

    (p * q)[i] = p[q[i]]          i.e.  p * q = p o q

so a prefix product x_1 * x_2 * ... * x_t applies x_t first and x_1 last. (Any fixed convention
gives an isomorphic group; this one is written down so tests can compose permutations by hand.)
Permutation groups list their elements in lexicographic order of `perms`, so the identity is id 0.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import torch

# Tables are order x order int64 tensors; 2520 (A7) keeps the largest one at ~50 MB.
MAX_ORDER = 2520


def _fail(field_name: str, value, allowed: str) -> None:
    raise ValueError(f"{field_name}={value!r} is invalid; allowed: {allowed}")


def _check_int(name: str, value, low: int, high: int) -> None:
    if not (isinstance(value, int) and not isinstance(value, bool) and low <= value <= high):
        _fail(name, value, f"an integer in [{low}, {high}]")


@dataclass(frozen=True, eq=False)
class Group:
    """A finite group given by its multiplication table.

    name:      short name ("A5", "Z60", "A4xZ5"); `get_group(name)` rebuilds it.
    mul_table: LongTensor [order, order]; mul_table[a, b] is the id of a * b.
    identity:  id of the identity element.
    inverse:   LongTensor [order]; inverse[a] is the id of a^-1 (computed from the table).
    """

    name: str
    mul_table: torch.Tensor
    identity: int
    inverse: torch.Tensor = field(init=False, repr=False)

    def __post_init__(self):
        t = self.mul_table
        if t.dtype != torch.long or t.dim() != 2 or t.shape[0] != t.shape[1] or t.shape[0] < 1:
            _fail("mul_table", tuple(t.shape), "a square LongTensor [order, order]")
        n = t.shape[0]
        if not 0 <= self.identity < n:
            _fail("identity", self.identity, f"an element id in [0, {n - 1}]")
        # Each row of a group table holds the identity exactly once: that column is the inverse.
        hits = t == self.identity
        if not bool((hits.sum(1) == 1).all()):
            raise ValueError(
                f"mul_table: {self.name} is not a group table (some element has no unique inverse)"
            )
        object.__setattr__(self, "inverse", hits.long().argmax(1))

    @property
    def order(self) -> int:
        return self.mul_table.shape[0]

    def mul(self, a: int, b: int) -> int:
        """Id of a * b."""
        return int(self.mul_table[a, b])

    def is_commutative(self) -> bool:
        return bool(torch.equal(self.mul_table, self.mul_table.T))

    def prefix_products(self, x: torch.Tensor) -> torch.Tensor:
        """Running products along the last dim: out[..., t] = x[..., 0] * x[..., 1] * ... * x[...,
        t].

        Composed left to right with `mul_table` (earlier element on the left). Uses a
        Hillis-Steele scan, log2(T) table lookups instead of T, which is valid because the
        product is associative (the order of factors is kept; only the bracketing changes).
        """
        out = x.long().clone()
        table = self.mul_table.to(out.device)
        k = 1
        while k < out.shape[-1]:
            # out[t] currently covers x[t-k+1 .. t]; prepend the block x[t-2k+1 .. t-k].
            nxt = out.clone()
            nxt[..., k:] = table[out[..., :-k], out[..., k:]]
            out = nxt
            k *= 2
        return out

    def __repr__(self) -> str:
        kind = "commutative" if self.is_commutative() else "non-commutative"
        return f"Group({self.name}, order={self.order}, {kind})"


@dataclass(frozen=True, eq=False, repr=False)
class PermutationGroup(Group):
    """A group of permutations of `degree` points; `perms[id]` is the permutation of element id.

    Composition convention: (p * q)[i] = p[q[i]] (apply q first), see the module docstring.
    """

    perms: tuple = ()

    @property
    def degree(self) -> int:
        return len(self.perms[0]) if self.perms else 0

    def element_id(self, perm) -> int:
        """Id of a permutation given as a sequence of images; ValueError if not in the group."""
        try:
            return self.perms.index(tuple(perm))
        except ValueError:
            raise ValueError(f"perm={tuple(perm)!r} is not an element of {self.name}") from None


def _permutation_group(name: str, perms: list[tuple]) -> PermutationGroup:
    """Table for a list of permutations (of points 0..n-1),
    which must be closed under composition."""
    perms = sorted(set(perms))
    n, size = len(perms[0]), len(perms)
    p = torch.tensor(perms, dtype=torch.long)  # [N, n]
    # Key each permutation by its images of the first k points, k as small as keeps keys distinct
    # (k = 2 for dihedral groups, n - 1 for S_n), read as a base-n integer: lexicographic order of
    # perms = numeric order of keys, so a composed permutation is found with searchsorted.
    k = next(k for k in range(1, n + 1) if len(set(q[:k] for q in perms)) == size)
    weights = n ** torch.arange(k - 1, -1, -1, dtype=torch.long)
    keys = p[:, :k] @ weights
    # comp[a, b, i] = p[a][p[b][i]]: row a of p gathered at the points p[b]. Done in row chunks
    # so that A7 (2520 elements) never materialises a 2520 x 2520 x 7 tensor.
    rows = []
    chunk = max(1, 2**22 // (size * n))
    for start in range(0, size, chunk):
        a = torch.arange(start, min(start + chunk, size))
        comp = p[a[:, None, None], p[None, :, :]]  # [chunk, N, n]
        ids = torch.searchsorted(keys, comp[..., :k] @ weights).clamp_max(size - 1)
        if not torch.equal(p[ids], comp):
            raise ValueError(f"perms: {name} is not closed under composition")
        rows.append(ids)
    return PermutationGroup(name=name, mul_table=torch.cat(rows), identity=0, perms=tuple(perms))


def _parity(perm: tuple) -> int:
    """0 for even, 1 for odd: n minus the number of cycles, mod 2."""
    seen, cycles = set(), 0
    for start in range(len(perm)):
        if start not in seen:
            cycles += 1
            i = start
            while i not in seen:
                seen.add(i)
                i = perm[i]
    return (len(perm) - cycles) % 2


def symmetric(n: int) -> PermutationGroup:
    """S_n: all n! permutations of n points (S5: order 120)."""
    _check_int("n", n, 1, 6)
    return _permutation_group(f"S{n}", list(itertools.permutations(range(n))))


def alternating(n: int) -> PermutationGroup:
    """A_n: the n!/2 even permutations of n points. A5 (order 60) is the paper's state-tracking
    group: the smallest non-solvable group, so its word problem is NC^1-complete (Barrington)."""
    _check_int("n", n, 1, 7)
    return _permutation_group(
        f"A{n}", [p for p in itertools.permutations(range(n)) if _parity(p) == 0]
    )


def dihedral(n: int) -> PermutationGroup:
    """D_n: the 2n symmetries of a regular n-gon, as
    permutations of its vertices (D30: order 60)."""
    _check_int("n", n, 3, MAX_ORDER // 2)
    rot = [tuple((k + i) % n for i in range(n)) for k in range(n)]
    ref = [tuple((k - i) % n for i in range(n)) for k in range(n)]
    return _permutation_group(f"D{n}", rot + ref)


def cyclic(n: int) -> Group:
    """Z_n: integers mod n under addition; id k is k, identity 0 (Z60: the paper's control)."""
    _check_int("n", n, 1, MAX_ORDER)
    k = torch.arange(n)
    return Group(name=f"Z{n}", mul_table=(k[:, None] + k[None, :]) % n, identity=0)


def direct_product(g: Group, h: Group) -> Group:
    """G x H with componentwise multiplication. Element (a, b) has id a * |H| + b."""
    if g.order * h.order > MAX_ORDER:
        _fail("order", g.order * h.order, f"a product of order at most {MAX_ORDER}")
    ng, nh = g.order, h.order
    table = g.mul_table[:, None, :, None] * nh + h.mul_table[None, :, None, :]
    return Group(
        name=f"{g.name}x{h.name}",
        mul_table=table.reshape(ng * nh, ng * nh),
        identity=g.identity * nh + h.identity,
    )


_FACTORS = {"a": alternating, "s": symmetric, "z": cyclic, "d": dihedral}


def get_group(name: str) -> Group:
    """Build a group from its name: factors A<n>, S<n>, Z<n>, D<n> joined by 'x', case-insensitive.

    Examples: "A5", "S5", "Z60", "D30", "A4xZ5" (= direct_product(alternating(4), cyclic(5))).
    """
    allowed = "factors A<n>, S<n>, Z<n>, D<n> joined by 'x', e.g. A5, S5, Z60, D30, A4xZ5"
    if not isinstance(name, str) or not name:
        _fail("group", name, allowed)
    result = None
    for part in name.lower().split("x"):
        if (
            len(part) < 2
            or part[0] not in _FACTORS
            or not part[1:].isascii()
            or not part[1:].isdigit()
        ):
            _fail("group", name, allowed)
        try:
            factor = _FACTORS[part[0]](int(part[1:]))
            result = factor if result is None else direct_product(result, factor)
        except ValueError as e:  # e.g. "n=5000 is invalid": say it about the group the user named
            limit = str(e).split("allowed: ")[-1]
            why = limit if str(e).startswith("order") else f"{part[0].upper()}<n> with n {limit}"
            _fail("group", name, f"{allowed}; {why}")
    return result


__all__ = [
    "Group",
    "PermutationGroup",
    "symmetric",
    "alternating",
    "dihedral",
    "cyclic",
    "direct_product",
    "get_group",
    "MAX_ORDER",
]
