"""Group tests and rounds of `gpucheck bisect`, on a simulated group test (a function of the set).

    python benchmarks/bench_bisect.py                 # the table for benchmarks/RESULTS.md
    python benchmarks/bench_bisect.py --flaky         # and the flaky-test runs
    python benchmarks/bench_bisect.py --json

The group test fails when the group holds a bad node (with --flaky, each result is also wrong
with probability 2 %). For every N in 64..4096 and k in 1, 2, 4, 8, 16 it runs, over 5 random
placements of the k bad nodes, each strategy:

- binary --parallel 1: generalized binary splitting, one test a round (fewest tests), the
  number of bad nodes unknown (estimated as the search goes);
- binary --parallel 1 --max-bad k: the same told that there are at most k bad nodes (Hwang's
  generalized binary splitting for at most k: the whole set, then at most
  ceil(log2 C(N, k)) + k - 1 tests);
- binary (--parallel 0): the whole set, then every failing group in four parts at once;
- grid: rows of sqrt(N), then columns, then (several bad rows) the search of the crossings;

and prints the worst search tests / search rounds, the worst tests / rounds in all (with the
verification, the re-tests and the control groups), next to the issue's goals (tests within
k*log2(N/k) + k, rounds within log2(N) + 3), the information-theoretic floor
ceil(log2 C(N, k)): no sequence of yes/no tests can tell every placement of k bad nodes among N
apart with fewer, whatever the algorithm, and Hwang's bound for `--max-bad k`: the whole set,
then ceil(log2 C(N, k)) + k - 1. A run is counted only if it names exactly the bad nodes.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpucheck.fleet.bisect import GroupOutcome, bisect  # noqa: E402
from gpucheck.fleet.bisect.search import splitting_bound  # noqa: E402

NS = (64, 128, 256, 512, 1024, 2048, 4096)
KS = (1, 2, 4, 8, 16)
# name: (strategy, parallel, told --max-bad k)
STRATEGIES = {"binary --parallel 1": ("binary", 1, False), "binary --parallel 1 --max-bad k": ("binary", 1, True),
              "binary": ("binary", 0, False), "grid": ("grid", 0, False)}


def simulated(bad: frozenset[str], flake: float = 0.0, seed: int = 0):
    rng = random.Random(seed)

    def test(group: list[str]) -> GroupOutcome:
        healthy = bad.isdisjoint(group)
        if flake and rng.random() < flake:
            healthy = not healthy
        return GroupOutcome(healthy)

    return test


def placements(n: int, k: int, seeds: int, neighbours: bool) -> list[frozenset[str]]:
    nodes = [f"n{i:04d}" for i in range(n)]
    if neighbours:  # a rack: k consecutive nodes, at the front, in the middle, at the end
        return [frozenset(nodes[s:s + k]) for s in (0, (n - k) // 2, n - k)]
    return [frozenset(random.Random(seed).sample(nodes, k)) for seed in range(seeds)]


def measure(n: int, k: int, strategy: str, parallel: int, *, seeds: int, neighbours: bool = False,
            max_bad: int | None = None) -> dict:
    nodes = [f"n{i:04d}" for i in range(n)]
    worst = {"search_tests": 0, "search_rounds": 0, "tests": 0, "rounds": 0}
    for bad in placements(n, k, seeds, neighbours):
        r = bisect(nodes, simulated(bad), strategy=strategy, parallel=parallel, max_bad=max_bad)
        if set(r.bad_nodes) != bad or r.exit_code != 1:
            raise AssertionError(f"{strategy} --parallel {parallel} --max-bad {max_bad} N={n} k={k}: "
                                 f"named {r.bad_nodes}")
        for key in worst:
            worst[key] = max(worst[key], getattr(r, key))
    return worst


def table(seeds: int, neighbours: bool) -> list[dict]:
    rows = []
    for n in NS:
        for k in KS:
            row = {"N": n, "k": k, "goal_tests": round(k * math.log2(n / k) + k),
                   "floor_tests": math.ceil(math.log2(math.comb(n, k))), "goal_rounds": math.ceil(math.log2(n)) + 3,
                   "hwang_tests": 1 + splitting_bound(n, k)}
            for name, (strategy, parallel, told) in STRATEGIES.items():
                row[name] = measure(n, k, strategy, parallel, seeds=seeds, neighbours=neighbours,
                                    max_bad=k if told else None)
            rows.append(row)
    return rows


def flaky(runs: int) -> list[dict]:
    """N=256, k=2, every result wrong with probability 2 %, --repeats 3, --group-size 16."""
    out = []
    nodes = [f"n{i:04d}" for i in range(256)]
    for name, (strategy, parallel, told) in STRATEGIES.items():
        right, tests, rounds = 0, [], []
        for seed in range(runs):
            bad = frozenset(random.Random(100 + seed).sample(nodes, 2))
            r = bisect(nodes, simulated(bad, 0.02, seed), strategy=strategy, parallel=parallel, repeats=3,
                       group_size=16, max_bad=2 if told else None)
            right += set(r.bad_nodes) == bad and r.exit_code == 1
            tests.append(r.tests)
            rounds.append(r.rounds)
        out.append({"strategy": name, "runs": runs, "right": right, "tests_median": sorted(tests)[runs // 2],
                    "tests_max": max(tests), "rounds_median": sorted(rounds)[runs // 2], "rounds_max": max(rounds)})
    return out


def _cell(m: dict) -> str:
    return f"{m['search_tests']} / {m['search_rounds']} ({m['tests']} / {m['rounds']})"


def print_markdown(rows: list[dict], title: str) -> None:
    print(f"\n{title}\n")
    names = list(STRATEGIES)
    print("| N | k | goal: tests / rounds | floor: tests | Hwang: tests | " + " | ".join(names) + " |")
    print("|---|---|---|---|---|" + "---|" * len(names))
    for r in rows:
        cells = " | ".join(_cell(r[name]) for name in names)
        print(f"| {r['N']} | {r['k']} | {r['goal_tests']} / {r['goal_rounds']} | {r['floor_tests']} | "
              f"{r['hwang_tests']} | {cells} |")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, default=5, help="random placements per cell")
    ap.add_argument("--flaky", action="store_true", help="also the flaky-test runs")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    t0 = time.monotonic()
    doc = {"random": table(args.seeds, False), "neighbours": table(args.seeds, True)}
    if args.flaky:
        doc["flaky"] = flaky(20)
    doc["seconds"] = round(time.monotonic() - t0, 1)
    if args.json:
        print(json.dumps(doc, indent=1))
        return 0
    print_markdown(doc["random"], f"worst of {args.seeds} random placements: search tests / search rounds "
                                  "(all tests / all rounds)")
    print_markdown(doc["neighbours"], "k neighbours (a rack) at the front, in the middle, at the end: worst")
    for f in doc.get("flaky", []):
        print(f"flaky 2 %, N=256, k=2, --repeats 3: {f['strategy']}: {f['right']}/{f['runs']} right, tests median "
              f"{f['tests_median']} (max {f['tests_max']}), rounds median {f['rounds_median']} "
              f"(max {f['rounds_max']})")
    print(f"\n{doc['seconds']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
