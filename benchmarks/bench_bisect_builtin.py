"""Group tests, rounds and wall time of `gpucheck bisect --builtin allreduce` to localize one
rate-limited host among eight (network namespaces, tests/netns.py; root only).

    sudo python benchmarks/bench_bisect_builtin.py [--runs 1] [--rate 50mbit] [--no-bitwise]

Eight "hosts" on a bridge, host 6 limited with tbf both ways; gloo over the veths, all_gather
and all_reduce of 1 MB, 3 iterations, the bitwise check on every node (CPU worker), every
default of the command (binary/grid, no --min-busbw, no --slow-limit, no --ifname). For each
strategy it prints the exit code, the nodes named, the tests and rounds (all, and those of the
reference pairs), and the wall time of the whole command.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

import netns  # noqa: E402

PY = [sys.executable, "-m", "gpucheck"]


def run(lab, strategy: str, bitwise: bool, code: Path = ROOT, verbose: bool = False) -> dict:
    hosts = lab.hosts
    argv = [*PY, "bisect", ",".join(hosts), "--builtin", "allreduce", "--strategy", strategy,
            "--launcher", "ip netns exec {host} {cmd}", "--program", " ".join(PY), "--backend", "gloo",
            "--sizes", "1M", "--iters", "3", "--timeout", "30s", "--test-timeout", "300s", "--json",
            *[a for h in hosts for a in ("--addr", f"{h}={lab.addrs[h]}")]]
    argv += ["--bitwise-arg=--device=cpu", "--bitwise-arg=--workers=1"] if bitwise else ["--no-bitwise"]
    t0 = time.monotonic()
    r = subprocess.run(argv, capture_output=True, text=True, timeout=1800, cwd=str(code),
                       env={**os.environ, "PYTHONPATH": str(code)})
    wall = time.monotonic() - t0
    doc = json.loads(r.stdout)
    pairs = [t for t in doc["records"] if t["phase"] in ("pairs", "re-pair", "control")]
    out = {"strategy": strategy, "exit": r.returncode, "bad": doc["bad"], "tests": doc["tests"],
           "rounds": doc["rounds"], "pair_tests": len(pairs), "pair_rounds": len({t["round"] for t in pairs}),
           "wall_s": round(wall, 1)}
    if verbose:
        out["records"] = [(t["round"], t["phase"], t["nodes"], t["healthy"], t["detail"][:160]) for t in doc["records"]]
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--rate", default="50mbit")
    ap.add_argument("--no-bitwise", action="store_true")
    ap.add_argument("--code", type=Path, default=ROOT, help="the gpucheck checkout to run (an older one: before)")
    ap.add_argument("--verbose", action="store_true", help="every test's record")
    args = ap.parse_args()
    why = netns.usable()
    if why:
        print(f"cannot run: {why}", file=sys.stderr)
        return 2
    with netns.running_lab(8, str(args.code)) as lab:
        slow = lab.hosts[5]
        lab.shape(slow, args.rate)
        print(f"8 hosts, {slow} limited to {args.rate}; load average {os.getloadavg()[0]:.1f}")
        try:
            for _ in range(args.runs):
                for strategy in ("binary", "grid"):
                    res = run(lab, strategy, not args.no_bitwise, args.code, args.verbose)
                    res["found_slow"] = res["bad"] == slow
                    print(json.dumps(res), flush=True)
        finally:
            lab.unshape(slow)
        print(f"load average {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
