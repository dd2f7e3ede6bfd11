"""gpucheck's all-reduce timing against a bare torch.distributed all-reduce loop, same size, same run.

    sudo python benchmarks/bench_allreduce.py [--sizes 1M,16M] [--iters 40] [--reps 3]

With root, the two ranks run in two network namespaces joined by a bridge (gloo over veth, as the
namespace tests); without root, both on 127.0.0.1. For each size and repetition it runs, one
after the other:

- gpucheck: `gpucheck nccl run` on both "hosts" (launched like `gpucheck nccl pairs` does), whose
  reported time is the median over iterations of the slowest rank's time of one all-reduce
  (each iteration is preceded by a barrier and followed by the data check, both untimed);
- bare: a minimal script that inits gloo the same way and times `dist.all_reduce(x)` in a loop
  (per-iteration perf_counter, aggregated like gpucheck: median over iterations of the slower
  rank's time; and the whole loop / iterations).

It prints one table and, with --json, a JSON document. The goal is gpucheck within 5% of bare.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

BARE = r"""
import datetime, json, sys, time
import torch, torch.distributed as dist
rank, addr = int(sys.argv[1]), sys.argv[2]
port, size, iters, warmup = (int(v) for v in sys.argv[3:7])
torch.set_num_threads(1)
td = datetime.timedelta(seconds=60)
store = dist.TCPStore(addr, port, 2, rank == 0, timeout=td, wait_for_workers=False)
dist.init_process_group("gloo", store=store, rank=rank, world_size=2, timeout=td)
x = torch.ones(size // 4)
for _ in range(warmup):
    dist.all_reduce(x)
dist.barrier()
per = []
t0 = time.perf_counter()
for _ in range(iters):
    t = time.perf_counter()
    dist.all_reduce(x)
    per.append(time.perf_counter() - t)
loop = (time.perf_counter() - t0) / iters
print(json.dumps({"rank": rank, "per_s": per, "loop_s": loop}), flush=True)
dist.destroy_process_group()
"""


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_bare(wrap, addr: str, size: int, iters: int, warmup: int, env: dict) -> dict:
    port = 29000 + (os.getpid() + int(time.time())) % 5000 if wrap else _free_port()
    procs = [subprocess.Popen([*wrap(r), sys.executable, "-c", BARE, str(r), addr, str(port), str(size), str(iters),
                               str(warmup)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for r in range(2)]
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=300)
        if p.returncode != 0:
            raise RuntimeError(f"bare loop failed: {err.strip().splitlines()[-1:]}")
        outs.append(json.loads(out.strip().splitlines()[-1]))
    # aggregated as gpucheck does: per iteration the slower rank's time, then the median
    per_iter = [max(a, b) for a, b in zip(outs[0]["per_s"], outs[1]["per_s"])]
    return {"median_s": statistics.median(per_iter), "loop_s": max(o["loop_s"] for o in outs)}


def run_gpucheck(hosts, launcher, size: int, iters: int, warmup: int, ifname) -> dict:
    from gpucheck.nccl import launch as L

    args = L.run_args(ops=["all_reduce"], sizes=[size], iters=iters, warmup=warmup, timeout_s=60,
                      backend="gloo", ifname=ifname)
    out = L.run_group(hosts, launcher, args, deadline_s=600)
    if out["status"] != "ok":
        raise RuntimeError(f"gpucheck run failed: {out['summary']} {out.get('launch_errors')}")
    row = out["results"][0]
    return {"time_s": row["time_s"], "busbw_gbs": row["busbw_gbs"]}


def main() -> int:
    from gpucheck.nccl import launch as L
    from gpucheck.nccl.bandwidth import busbw_factor, format_size, parse_sizes

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1M,16M")
    ap.add_argument("--iters", type=int, default=40)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    sizes = parse_sizes(a.sizes)
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "TORCH_CPP_LOG_LEVEL": "ERROR"}
    os.environ["PYTHONPATH"] = env["PYTHONPATH"]

    lab = None
    import netns

    why = netns.usable()
    try:
        if why is None:
            lab = netns.Lab(2)
            hosts = lab.hosts
            launcher = L.Launcher("ip netns exec {host} {cmd}", addrs=dict(lab.addrs),
                                  program=[sys.executable, "-m", "gpucheck.cli.main"])
            ifname = netns.IFACE
            env["GLOO_SOCKET_IFNAME"] = netns.IFACE

            def wrap(rank: int) -> list[str]:
                return ["ip", "netns", "exec", hosts[rank]]

            addr = lab.addrs[hosts[0]]
            where = "two network namespaces on a bridge (veth), gloo"
        else:
            hosts = ["a", "b"]
            launcher = L.Launcher("{cmd}", addrs={"a": "127.0.0.1", "b": "127.0.0.1"},
                                  program=[sys.executable, "-m", "gpucheck.cli.main"])
            ifname, addr, wrap = None, "127.0.0.1", None
            where = f"two processes on 127.0.0.1, gloo ({why})"
        rows = []
        for size in sizes:
            g, b, bl = [], [], []
            for _ in range(a.reps):
                g.append(run_gpucheck(hosts, launcher, size, a.iters, a.warmup, ifname)["time_s"])
                r = run_bare(wrap or (lambda _r: []), addr, size, a.iters, a.warmup, env)
                b.append(r["median_s"])
                bl.append(r["loop_s"])
            gm, bm, blm = statistics.median(g), statistics.median(b), statistics.median(bl)
            rows.append({"size": size, "gpucheck_s": gm, "bare_median_s": bm, "bare_loop_s": blm,
                         "ratio_vs_bare_median": gm / bm, "ratio_vs_bare_loop": gm / blm,
                         "gpucheck_busbw_gbs": size / gm / 1e9 * busbw_factor("all_reduce", 2),
                         "runs": {"gpucheck_s": g, "bare_median_s": b, "bare_loop_s": bl}})
    finally:
        if lab is not None:
            lab.close()
    doc = {"where": where, "iters": a.iters, "warmup": a.warmup, "reps": a.reps, "cpus": os.cpu_count(),
           "rows": rows}
    if a.json:
        print(json.dumps(doc, indent=2))
    else:
        print(f"all-reduce, 2 ranks, {where}; {a.iters} iters after {a.warmup} warm-up, median of {a.reps} reps")
        print(f"{'size':>6} {'gpucheck ms':>12} {'bare ms':>9} {'bare loop ms':>13} {'ratio':>7} {'ratio(loop)':>12}")
        for r in rows:
            print(f"{format_size(r['size']):>6} {r['gpucheck_s'] * 1e3:12.3f} {r['bare_median_s'] * 1e3:9.3f} "
                  f"{r['bare_loop_s'] * 1e3:13.3f} {r['ratio_vs_bare_median']:7.3f} {r['ratio_vs_bare_loop']:12.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
