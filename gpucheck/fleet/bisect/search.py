"""The search: from groups known to fail to the nodes that make them fail.

Two ways, chosen by how many tests may run at once (Session.parallel):

sequential (parallel 1): Hwang's generalized binary splitting, fewest tests. With d bad nodes
    expected among n undecided, test a group of 2^a nodes, a = floor(log2((n - d + 1) / d)):
    a healthy group is cleared, a failing one is halved down to one bad node, which leaves with
    the nodes found good on the way; n <= 2d - 2 nodes are tested one by one. One test a round.
    --max-bad K (at most K bad nodes): d = K - (found so far), at most
    splitting_bound(N, K) = ceil(log2 C(N, K)) + K - 1 tests after the whole set failed. Once
    K are found the nodes not found bad are tested together: a pass ends the search (and counts
    as the verification); a failure means more than K, and the search goes on as below on the
    rest, with a note. K not given: d starts at 1 and is then estimated from the share of bad
    nodes among the nodes decided so far, never above the number found (so the estimate of the
    total at most doubles); with d = 1 every node not found bad is tested together (the
    remainder), and a healthy remainder ends the search (and counts as the verification).
parallel (parallel 0 or > 1): every failing block is split in four parts and all the parts of
    all the blocks are tested in one round (they share no node): a bad node among N is found in
    ceil(log4 N) rounds whatever the number of bad nodes, for about twice the tests. When
    --max-bad says each failing block holds exactly one bad node, three parts of four are
    tested and the fourth is inferred.

Groups smaller than `min_group` (a collective needs two nodes) are padded with known-good
nodes, each group of a round with different ones so that the round stays one round. When no
group has passed after max(8, 2 log2 N + 2) tests (sequential with --max-bad K: and not before
the bounded search and the test of the rest, splitting_bound(N, K) + 2), three small groups
spread over the list are tested: if they fail too, the test fails whatever the nodes:
TestBroken (no node blamed).
"""

from __future__ import annotations

import math

from .session import Session, TestBroken

SPLIT = 4  # parts per failing block in one parallel round


def pad(group: list[str], pool: list[str], size: int, avoid: set[str] | None = None) -> list[str]:
    """`group` plus known-good nodes from `pool` up to `size` (nodes in `avoid` used last)."""
    if len(group) >= size:
        return list(group)
    inside = set(group)
    avoid = avoid or set()
    fresh = [p for p in pool if p not in inside and p not in avoid]
    reused = [p for p in pool if p not in inside and p in avoid]
    return list(group) + (fresh + reused)[: size - len(group)]


def split(block: list[str], parts: int = SPLIT) -> list[list[str]]:
    """`block` in up to `parts` consecutive pieces of near-equal size (none empty)."""
    n = len(block)
    k = min(parts, n)
    sizes = [n // k + (1 if i < n % k else 0) for i in range(k)]
    out, at = [], 0
    for s in sizes:
        out.append(block[at:at + s])
        at += s
    return out


def futility_limit(n: int) -> int:
    """Tests without a single pass after which the group test is judged broken."""
    return max(8, 2 * math.ceil(math.log2(max(n, 2))) + 2)


def splitting_bound(n: int, k: int) -> int:
    """The most tests generalized binary splitting needs to find at most k bad nodes among n that
    fail together (Hwang's bound, ceil(log2 C(n, k)) + k - 1), the test of the n not counted."""
    k = max(1, min(k, n))
    return (math.comb(n, k) - 1).bit_length() + k - 1  # bit_length of C - 1: ceil(log2 C), exact


class Search:
    """Adaptive group testing over `universe` (the nodes of the bisection). `good` is the shared
    list of known-good nodes (grown by every passing test); `found` the nodes judged bad."""

    def __init__(self, session: Session, universe: list[str], *, min_group: int, good: list[str],
                 repeats: int = 1, max_bad: int | None = None, whole_rest: bool = False):
        self.s = session
        self.whole_rest = whole_rest  # the remainder test holds every node not found bad (it verifies)
        self.universe = list(universe)
        self.min_group = min_group
        self.good = good
        self._good_set = set(good)
        self.repeats = repeats  # > 1: every test is a majority vote (after a contradiction)
        self.max_bad = max_bad
        self.found: set[str] = set()
        self.over_max_bad = False  # more than max_bad bad nodes turned up: searching without the bound
        self.notes: list[str] = []  # for the result (max_bad exceeded)
        self._probed = False
        self.unexplained: list[list[str]] = []  # failing blocks whose parts all passed

    @property
    def parallel(self) -> bool:
        return self.s.parallel != 1

    # -- testing ------------------------------------------------------------------------------
    def _pool(self, avoid: set[str]) -> list[str]:
        """Known-good nodes to pad with. With none yet, test the nodes outside `avoid` together:
        if they pass they are the pool; if they fail too, pad with them anyway (the verification
        and the re-tests afterwards catch a wrong conclusion)."""
        if self.good:
            return self.good
        rest = [n for n in self.universe if n not in avoid and n not in self.found]
        if len(rest) >= self.min_group and self.run([rest], "pool")[0]:
            return self.good
        return rest

    def _mark_good(self, nodes: list[str]) -> None:
        for n in nodes:
            if n not in self._good_set:
                self._good_set.add(n)
                self.good.append(n)

    def run(self, pieces: list[list[str]], phase: str = "search", avoid: set[str] | None = None) -> list[bool]:
        """Test each piece (padded to min_group) in as few rounds as possible; passing pieces
        become known good. `avoid`: nodes a pad must not come from (the undecided ones)."""
        avoid = set(avoid or ()) | {n for p in pieces for n in p}
        groups: list[list[str]] = []
        used: set[str] = set()
        for p in pieces:
            g = p if len(p) >= self.min_group else pad(p, self._pool(avoid), self.min_group, avoid=used)
            if len(g) < self.min_group:
                raise TestBroken(f"no known-good node to test {', '.join(p)} with (a group needs {self.min_group} "
                                 "nodes): the nodes cannot be told apart")
            used |= set(g) - set(p)
            groups.append(g)
        if self.repeats > 1:
            ok = [self.s.majority(g, phase, self.repeats, cache=True) for g in groups]
        else:
            ok = self.s.run(groups, phase)
        for p, healthy in zip(pieces, ok):
            if healthy:
                self._mark_good(p)
        self._check_futile()
        return ok

    def test(self, nodes: list[str], phase: str = "search", avoid: list[str] | None = None) -> bool:
        return self.run([nodes], phase, set(avoid or ()))[0]

    def _check_futile(self) -> None:
        """No group has passed after many tests: either the bad nodes sit where the search looked
        first (neighbours at the front), or the test fails whatever the nodes. Three small groups
        spread over the list tell: one passes, the search goes on; all fail, the test is broken."""
        if self.s.passed_any or self._probed or self.s.tests < self._futility_limit():
            return
        self._probed = True
        rest = [n for n in self.universe if n not in self.found]
        size = max(1, self.min_group)
        starts = sorted({min(len(rest) - size, int(len(rest) * f)) for f in (0.25, 0.5, 0.75)})
        probes = [rest[i:i + size] for i in starts if i >= 0]
        ok = self.s.run(probes, "probe")
        for p, healthy in zip(probes, ok):
            if healthy:
                self._mark_good(p)
        if not any(ok):
            raise TestBroken(no_pass_reason(self.s) + f"; {len(probes)} small groups spread over the list "
                                                      "failed too")

    def _futility_limit(self) -> int:
        """futility_limit(N); with --max-bad and one test at a time, not before the bounded search
        (the whole set, then at most splitting_bound(N, K) tests) and the test of the rest have run,
        so that K neighbours where the search looks first cost no probes."""
        limit = futility_limit(len(self.universe))
        if self.max_bad is None or self.parallel:
            return limit
        return max(limit, splitting_bound(len(self.universe), self.max_bad) + 2)

    def _found(self, node: str, into: list[str]) -> None:
        into.append(node)
        self.found.add(node)

    # -- entry --------------------------------------------------------------------------------
    def find(self, blocks: list[list[str]], *, known_bad: bool = True) -> list[str]:
        """The bad nodes in `blocks` (each known to fail when `known_bad`)."""
        if self.parallel:
            if not known_bad:
                ok = self.run(blocks)
                blocks = [b for b, healthy in zip(blocks, ok) if not healthy]
            return self.quartering(blocks)
        out: list[str] = []
        for b in blocks:
            out += self.splitting(b, known_bad=known_bad)
        return out

    # -- parallel: quartering -----------------------------------------------------------------
    def quartering(self, blocks: list[list[str]]) -> list[str]:
        """Split every failing block in four, all parts of all blocks in one round, until single
        nodes remain. A block whose parts all pass is kept in `unexplained`."""
        frontier = [b for b in blocks if b]
        suspects: list[str] = []
        while frontier:
            one_each = self.max_bad is not None and len(frontier) + len(suspects) >= self.max_bad
            plan, pieces = [], []
            for blk in frontier:
                if len(blk) == 1:
                    self._found(blk[0], suspects)
                    continue
                parts = self._parts(blk)
                tested = parts[:-1] if one_each else parts
                plan.append((blk, parts, len(tested)))
                pieces += tested
            if not pieces:
                break
            ok = self.run(pieces)
            frontier = self._next_frontier(plan, ok)
        return suspects

    def _parts(self, blk: list[str]) -> list[list[str]]:
        """Four parts; where parts smaller than a group would need pads and no known-good node
        exists yet, fewer parts of a whole group each."""
        parts = split(blk)
        if self.min_group > 1 and min(map(len, parts)) < self.min_group and not self.good:
            parts = split(blk, max(1, len(blk) // self.min_group))
        return parts

    def _next_frontier(self, plan: list, ok: list[bool]) -> list[list[str]]:
        frontier: list[list[str]] = []
        at = 0
        for blk, parts, tested in plan:
            res = ok[at:at + tested]
            at += tested
            failing = [p for p, healthy in zip(parts, res) if not healthy]
            if tested < len(parts) and not failing:
                failing = [parts[-1]]  # exactly one bad node in the block: the untested part
            if failing:
                frontier += failing
            else:
                self.unexplained.append(blk)
        return frontier

    # -- sequential: generalized binary splitting -----------------------------------------------
    def splitting(self, nodes: list[str], *, known_bad: bool) -> list[str]:
        """The bad nodes of `nodes`, one test at a time: for at most --max-bad of them when it is
        given (and not yet exceeded), else with the number estimated as the search goes."""
        if self.max_bad is not None and not self.over_max_bad:
            return self._bounded(nodes, known_bad=known_bad)
        return self._unbounded(nodes, known_bad=known_bad, found=[], cleared=0)

    def _bounded(self, nodes: list[str], *, known_bad: bool) -> list[str]:
        """Hwang's generalized binary splitting for at most d = max_bad - (found so far) bad
        nodes: groups of 2^a, a = floor(log2((n - d + 1) / d)), each failing one halved down to
        one bad node; n <= 2d - 2 nodes are tested one by one. Once the max_bad are found, the
        nodes left are tested together: a failure means more bad nodes than max_bad, and the
        search goes on without the bound (and says so)."""
        max_bad = self.max_bad or 0
        u, cleared = list(nodes), 0
        found: list[str] = []
        while u:
            d = max_bad - len(self.found)
            if d <= 0:
                break
            if len(u) <= 2 * d - 2:
                self._one_by_one(u, found)
                u = []
                break
            cleared, u, hit = self._split_once(u, d, known_bad, found, cleared)
            known_bad = known_bad and not hit  # the rest of a failing set still fails if g passed
        if not u or (not known_bad and self.test(self._remainder(u), "remainder")):
            if len(self.found) > max_bad:  # the nodes tested one by one held more
                self._over_max_bad(f"the search found {len(self.found)}")
            return found
        self._over_max_bad(f"the nodes left still failed together after {len(self.found)} were found; "
                           "the rest was searched without the bound")
        return self._unbounded(u, known_bad=True, found=found, cleared=cleared)

    def _over_max_bad(self, why: str) -> None:
        self.over_max_bad = True
        self.notes.append(f"more than --max-bad {self.max_bad} bad node(s): {why}")

    def _estimate(self, found: int, cleared: int, n: int) -> int:
        if not found:
            return 1
        share = found / (found + cleared)
        return max(1, min(int(round(share * n)), found))

    def _unbounded(self, nodes: list[str], *, known_bad: bool, found: list[str], cleared: int) -> list[str]:
        """Generalized binary splitting with d estimated from the share of bad nodes among those
        decided so far; with d = 1 the remainder is tested together and a pass ends the search."""
        u = list(nodes)
        while u:
            n = len(u)
            d = self._estimate(len(found), cleared, n)
            if d == 1 and not known_bad:
                if self.test(self._remainder(u), "remainder"):
                    break
                known_bad = True
            if n <= 2 * d - 2:
                cleared += self._one_by_one(u, found)
                break
            cleared, u, hit = self._split_once(u, d, known_bad, found, cleared)
            known_bad = known_bad and not hit  # the rest of a failing set still fails if g passed
        return found

    def _one_by_one(self, u: list[str], found: list[str]) -> int:
        """Test each node of `u` alone (padded); returns how many passed."""
        cleared = 0
        for x in u:
            if self.test([x], avoid=u):
                cleared += 1
            else:
                self._found(x, found)
        return cleared

    def _remainder(self, u: list[str]) -> list[str]:
        """What the remainder test holds: the undecided nodes, or (top-level search) every node
        not found bad, so that a pass is also the verification of the rest."""
        if not self.whole_rest:
            return u
        return [n for n in self.universe if n not in self.found]

    def _split_once(self, u: list[str], d: int, known_bad: bool, found: list[str],
                    cleared: int) -> tuple[int, list[str], bool]:
        """One step of Hwang's splitting: test 2^a nodes; clear them, or halve them to one bad."""
        n = len(u)
        a = int(math.floor(math.log2((n - d + 1) / d)))
        g = u[: 2 ** a]
        healthy = False if (len(g) == n and known_bad) else self.test(g, avoid=u)
        if healthy:
            return cleared + len(g), u[len(g):], False
        cand = g
        while len(cand) > 1:
            half = cand[: len(cand) // 2]
            if self.test(half, avoid=cand):
                gone = set(half)
                u = [x for x in u if x not in gone]
                cleared += len(half)
                cand = cand[len(half):]
            else:
                cand = half
        self._found(cand[0], found)
        u = [x for x in u if x != cand[0]]
        return cleared, u, True


def no_pass_reason(session: Session) -> str:
    """Why a test that never passed is judged broken, from its records."""
    recs = session.records
    if recs and all(r.timed_out for r in recs):
        return (f"every group test timed out ({len(recs)} of {len(recs)}): the test cannot finish "
                "whatever the nodes (raise --test-timeout, or check the command)")
    detail = next((r.detail for r in recs if r.detail), "")
    return (f"no group passed in {len(recs)} test(s): the test fails whatever the nodes"
            + (f" (first failure: {detail})" if detail else ""))
