"""Group tables checked against references that do not use the tables: permutations composed by
hand with the documented convention (p*q)[i] = p[q[i]], inversion counts for parity, modular
arithmetic for Z_n, and a brute-force normal-subgroup search for the simplicity of A5."""

import itertools
import math
import random

import pytest
import torch

from lrt_tasks.groups import (
    Group,
    alternating,
    cyclic,
    dihedral,
    direct_product,
    get_group,
    symmetric,
)


def compose(p, q):
    """Hand composition, the convention documented in tasks/groups.py: apply q first, then p."""
    return tuple(p[q[i]] for i in range(len(q)))


def inversions(p):
    return sum(1 for i, j in itertools.combinations(range(len(p)), 2) if p[i] > p[j])


ALL_60 = ["A5", "Z60", "A4xZ5", "D30"]


def group_axioms(g: Group):
    t = g.mul_table
    n = g.order
    e = g.identity
    assert t.dtype == torch.long and t.shape == (n, n)
    # closure: every entry is an element id, and each row/column is a permutation (Latin square)
    assert int(t.min()) >= 0 and int(t.max()) < n
    ar = torch.arange(n)
    assert torch.equal(t.sort(dim=1).values, ar.expand(n, n))
    assert torch.equal(t.sort(dim=0).values, ar[:, None].expand(n, n))
    # associativity, all n^3 triples: (ab)c == a(bc)
    ab_c = t[t[:, :, None], ar[None, None, :]]
    a_bc = t[ar[:, None, None], t[None, :, :]]
    assert torch.equal(ab_c, a_bc)
    # identity and inverses
    assert torch.equal(t[e], ar) and torch.equal(t[:, e], ar)
    assert torch.equal(t[ar, g.inverse], torch.full((n,), e))
    assert torch.equal(t[g.inverse, ar], torch.full((n,), e))


@pytest.mark.parametrize("name", ALL_60 + ["S5", "S3", "A4", "Z1", "D3", "Z2xZ3xS3"])
def test_group_axioms(name):
    group_axioms(get_group(name))


@pytest.mark.parametrize("name", ALL_60)
def test_sixty_element_controls(name):
    assert get_group(name).order == 60


def test_a5_is_the_even_permutations_of_five_points():
    a5 = alternating(5)
    assert a5.order == 60 and a5.degree == 5
    assert len(set(a5.perms)) == 60
    assert all(inversions(p) % 2 == 0 for p in a5.perms)
    assert sorted(a5.perms) == sorted(
        p for p in itertools.permutations(range(5)) if inversions(p) % 2 == 0
    )
    assert a5.perms[a5.identity] == (0, 1, 2, 3, 4)


@pytest.mark.parametrize(
    "make",
    [
        lambda: alternating(5),
        lambda: symmetric(5),
        lambda: symmetric(3),
        lambda: dihedral(30),
        lambda: alternating(4),
    ],
)
def test_table_matches_hand_composition(make):
    g = make()
    t = g.mul_table.tolist()
    for a, b in itertools.product(range(g.order), repeat=2):
        c = t[a][b]
        assert g.perms[c] == compose(g.perms[a], g.perms[b]), (a, b)
        if c == g.identity:
            assert int(g.inverse[a]) == b


def test_composition_convention_concrete():
    # (p*q)[i] = p[q[i]]: the transposition (0 1) after (1 2) sends 0->1, 1->2, 2->0.
    s3 = symmetric(3)
    p = s3.element_id((1, 0, 2))
    q = s3.element_id((0, 2, 1))
    assert s3.perms[s3.mul(p, q)] == (1, 2, 0)
    assert s3.perms[s3.mul(q, p)] == (2, 0, 1)
    with pytest.raises(ValueError, match="perm"):
        alternating(3).element_id((1, 0, 2))  # odd


def test_commutativity():
    assert not alternating(5).is_commutative()
    assert not symmetric(5).is_commutative()
    assert not get_group("A4xZ5").is_commutative()
    assert not dihedral(30).is_commutative()
    assert cyclic(60).is_commutative()
    assert get_group("Z3xZ4").is_commutative()


def test_cyclic_is_addition_mod_n():
    z = cyclic(60)
    for a, b in [(0, 0), (59, 1), (31, 45), (7, 53)]:
        assert z.mul(a, b) == (a + b) % 60
        assert int(z.inverse[a]) == (-a) % 60


def test_direct_product_is_componentwise():
    a4, z5 = alternating(4), cyclic(5)
    g = direct_product(a4, z5)
    assert g.name == "A4xZ5" and g.identity == 0
    rng = random.Random(0)
    for _ in range(200):
        a1, a2 = rng.randrange(12), rng.randrange(12)
        b1, b2 = rng.randrange(5), rng.randrange(5)
        expected_perm = compose(a4.perms[a1], a4.perms[a2])
        c = g.mul(a1 * 5 + b1, a2 * 5 + b2)
        assert a4.perms[c // 5] == expected_perm
        assert c % 5 == (b1 + b2) % 5


def test_element_orders_distinguish_the_controls():
    def order_counts(g):
        t, counts = g.mul_table.tolist(), {}
        for a in range(g.order):
            x, k = a, 1
            while x != g.identity:
                x, k = t[x][a], k + 1
            counts[k] = counts.get(k, 0) + 1
        return counts

    assert order_counts(alternating(5)) == {1: 1, 2: 15, 3: 20, 5: 24}
    assert order_counts(cyclic(60))[60] == 16  # phi(60) generators
    assert order_counts(get_group("A4xZ5"))[2] == 3


def conjugacy_classes(g):
    t, inv = g.mul_table.tolist(), g.inverse.tolist()
    classes, seen = [], set()
    for a in range(g.order):
        if a not in seen:
            cls = {t[t[x][a]][inv[x]] for x in range(g.order)}
            seen |= cls
            classes.append(frozenset(cls))
    return classes


def normal_subgroup_orders(g):
    """Brute force: a normal subgroup is a union of conjugacy classes that contains e, has size
    dividing |G|, and is closed under multiplication (finite + closed => subgroup)."""
    table = g.mul_table
    classes = conjugacy_classes(g)
    e_cls = next(c for c in classes if g.identity in c)
    others = [c for c in classes if c is not e_cls]
    found = set()
    for r in range(len(others) + 1):
        for combo in itertools.combinations(others, r):
            h = set(e_cls).union(*combo)
            if g.order % len(h):
                continue
            member = torch.zeros(g.order, dtype=torch.bool)
            member[list(h)] = True
            if bool(member[table[member][:, member]].all()):  # closed: every a*b lands in h
                found.add(len(h))
    return found


def test_a5_is_simple():
    a5 = alternating(5)
    assert sorted(len(c) for c in conjugacy_classes(a5)) == [1, 12, 12, 15, 20]
    assert normal_subgroup_orders(a5) == {1, 60}


def test_simplicity_check_can_fail():
    # The same search finds the proper normal subgroups of non-simple groups.
    assert normal_subgroup_orders(symmetric(5)) == {1, 60, 120}  # A5 in S5
    assert normal_subgroup_orders(alternating(4)) == {1, 4, 12}  # Klein four-group in A4


def test_prefix_products_match_sequential_fold():
    g = get_group("S4")
    x = torch.randint(g.order, (3, 37), generator=torch.Generator().manual_seed(1))
    out = g.prefix_products(x)
    for b in range(3):
        acc = g.perms[g.identity]
        for t in range(37):
            acc = compose(acc, g.perms[int(x[b, t])])
            assert g.perms[int(out[b, t])] == acc


def test_get_group_names_and_errors():
    assert get_group("a5").name == "A5"
    assert get_group("a4xz5").name == "A4xZ5"
    assert get_group("S5").order == math.factorial(5)
    for bad in ["Q8", "A", "", "A5x", "5A", "S9"]:
        with pytest.raises(ValueError, match="group|n"):
            get_group(bad)
    with pytest.raises(ValueError, match="n=0"):
        cyclic(0)
    with pytest.raises(ValueError, match="order"):
        direct_product(symmetric(5), alternating(5))
    with pytest.raises(ValueError, match="mul_table"):
        Group("bad", torch.zeros(3, 3, dtype=torch.long), 0)
