"""Sweep benchmark: `gpucheck sweep` of 64 node names served by a loopback sshd, against a plain
parallel `ssh host true` loop with the same fan-out (issue 8: the overhead of gpucheck itself).

    python benchmarks/bench_sweep.py [--nodes 64] [--fanout 64] [--rounds 3]

The node names node01..nodeNN map to 127.0.0.1-127.0.0.4 through an ssh config (tests/sshd_harness.py
starts sshd; root only). Three things are timed per round, interleaved, median over rounds:

  ssh true       a thread pool of `fanout` running `ssh -F cfg nodeXX true` for every node: the cost
                 of the ssh connections alone
  ssh gpucheck   the same pool running the sweep's exact remote command (`gpucheck run --json
                 --snapshot h100-healthy.json --no-history`) over plain ssh, output discarded: the
                 ssh connections plus gpucheck on the nodes
  gpucheck sweep the whole `gpucheck sweep` process: ClusterShell fan-out, the same remote command,
                 parsing and classifying every verdict, the fleet comparison, the report

sweep - ssh true is gpucheck's whole cost; sweep - ssh gpucheck is the sweep machinery's own.

Scale (no sshd, no root):

    python benchmarks/bench_sweep.py --simulate 10000 [--fanout 64] [--output report|json|table]

runs `gpucheck sweep 'sim[00001-10000]' --report FILE` (or `--json`, or the table) in a child
process whose fan-out is replaced by an in-process runner (the injectable `runner` of
gpucheck.fleet.sweep.run_sweep, through gpucheck.platform.fanout.run_nodes): every node answers at
once with a realistic healthy verdict, one line, as the ssh fan-out delivers it: the verdict of
tests/fixtures/snapshots/h100-healthy.json (59 results, about 80 KB) plus a burn.gemm result per
GPU (TFLOP/s with a little per-node noise) and a repro.bitwise digest set, so that the fleet
comparison has real work. Reported: the child's wall time, CPU time and peak RSS (wait4's
rusage), the report's size. What is measured is the sweep machinery alone (classification, schema checks,
the fleet comparison, the report); the transport is not. `--transport srun` keeps the real
fan-out instead (ClusterShell's exec worker, the one-line wrapper, the per-node output cap)
over a fake srun that runs the step here and a fake gpucheck that prints the verdict: that
adds about eight short processes per node, which dominate its time. CPU time (user + system, with
the fake srun's processes; and the sweep process's own) is printed too: on a shared machine it
varies less than the wall time.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from sshd_harness import SshdHarness, sshd_unavailable  # noqa: E402


def ssh_pool(h: SshdHarness, nodes: list[str], command: str, fanout: int) -> tuple[float, int]:
    def one(node: str) -> int:
        return subprocess.run(h.ssh_argv(node, command), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              stdin=subprocess.DEVNULL).returncode

    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=fanout) as pool:
        rcs = list(pool.map(one, nodes))
    return time.perf_counter() - t0, sum(1 for rc in rcs if rc != 0)


def sweep(env: dict[str, str], nodeset: str, remote_cmd: str, snapshot: str, fanout: int,
          report: Path) -> tuple[float, int, dict]:
    argv = [sys.executable, "-m", "gpucheck", "sweep", nodeset, "--remote-cmd", remote_cmd, "--snapshot", snapshot,
            "--run-arg=--no-history", "--fanout", str(fanout), "--timeout", "300s", "--report", str(report), "--json"]
    t0 = time.perf_counter()
    p = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, text=True)
    dt = time.perf_counter() - t0
    return dt, p.returncode, json.loads(report.read_text())


def simulated_verdict_template() -> str:
    """A healthy 8-GPU verdict as one line, with @NODE@, @TF0@..@TF7@ to fill per node."""
    p = subprocess.run([sys.executable, "-m", "gpucheck", "run", "--json", "--no-history", "--snapshot",
                        str(ROOT / "tests/fixtures/snapshots/h100-healthy.json")], capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": str(ROOT)}, check=True)
    v = json.loads(p.stdout)
    v["host"] = "@NODE@"
    v["results"] = [r for r in v["results"] if r["check"] != "repro.bitwise"]
    for g in range(8):
        v["results"].append({"check": "burn.gemm", "subject": f"gpu{g}", "gpu": g, "status": "pass",
                             "summary": f"GPU {g}: bf16 GEMM verified", "action": "none",
                             "metrics": {"tflops_bf16": {"value": f"@TF{g}@", "unit": "TFLOP/s"},
                                         "iterations_bf16": {"value": 400, "unit": "count"}},
                             "thresholds": [], "evidence": [], "injected": [], "duration_s": 30.0})
    digests = {"gemm.bf16": "a" * 64, "gemm.fp32": "b" * 64, "conv.bf16": "c" * 64}
    v["results"].append({"check": "repro.bitwise", "subject": "node", "gpu": None, "status": "pass",
                         "summary": "digests agree", "action": "none",
                         "metrics": {"digest_sets": {"value": {"f" * 16: digests}, "unit": ""}},
                         "thresholds": [], "evidence": [], "injected": [], "duration_s": 20.0})
    v["counts"]["pass"] += 9
    text = json.dumps(v, indent=2).replace("\n", "")  # what one_line delivers: newlines dropped
    for g in range(8):
        text = text.replace(f'"@TF{g}@"', f"@TF{g}@")
    return text


def simulated_runner(template: str):
    """A fan-out that answers every node at once, in-process, with the template's verdict."""
    import random

    from gpucheck.platform.fanout import NodeRun

    def runner(commands, *, mode, fanout=None, timeout_s=None, on_done=None, **_ignored):
        rng = random.Random(1)
        pieces = re.split(r"@NODE@|@TF\d@", template)  # the host, then the 8 GPUs' TFLOP/s
        assert len(pieces) == 10 and template.index("@NODE@") < template.index("@TF0@")
        runs = {}
        for node in commands:
            fill = [node] + [f"{700 + rng.uniform(-5, 5):.2f}" for _ in range(8)]
            text = "".join(x for pair in zip(pieces, fill + [""]) for x in pair)
            run = NodeRun(node, 0, text, duration_s=1.0, via=mode, command=commands[node])
            if on_done is not None:
                on_done(run)
            runs[node] = run
        return runs

    return runner


FAKE_SRUN = """#!/bin/sh
while [ $# -gt 0 ] && [ "$1" != /bin/sh ]; do shift; done
exec "$@"
"""


def fake_srun_bin(folder: Path, template: str) -> Path:
    """A fake srun (runs the step's command here) and a fake gpucheck that prints one verdict."""
    pieces = re.split(r"@NODE@|@TF\d@", template)
    fill = ["sim00001"] + ["700.00"] * 8
    (folder / "verdict.one").write_text("".join(x for pair in zip(pieces, fill + [""]) for x in pair) + "\n")
    (folder / "srun").write_text(FAKE_SRUN)
    (folder / "gpucheck-fake").write_text(f"#!/bin/sh\nexec cat {shlex.quote(str(folder / 'verdict.one'))}\n")
    for name in ("srun", "gpucheck-fake"):
        (folder / name).chmod(0o755)
    return folder


def child(args) -> int:
    """The measured process: `gpucheck sweep` with the simulated fan-out (or the real one over
    a fake srun)."""
    sys.path.insert(0, str(ROOT))
    from gpucheck.cli.main import main as gpucheck_main
    from gpucheck.platform import fanout

    argv = ["sweep", f"sim[{1:05d}-{args.child:05d}]", "--fanout", str(args.fanout)]
    if args.transport == "srun":
        bindir = fake_srun_bin(Path(args.template).parent, Path(args.template).read_text())
        os.environ["PATH"] = f"{bindir}:{os.environ['PATH']}"
        argv += ["--srun", "--remote-cmd", "gpucheck-fake", "--timeout", "600s"]
    else:
        fanout.run_nodes = simulated_runner(Path(args.template).read_text())
    if args.output == "report":
        argv += ["--report", args.report]
    elif args.output == "json":
        argv += ["--json"]
    rc = gpucheck_main(argv)
    import resource

    own = resource.getrusage(resource.RUSAGE_SELF)
    print(f"SELF_CPU {own.ru_utime + own.ru_stime:.1f}", file=sys.stderr)
    return rc


def simulate(args) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        template = Path(tmp) / "verdict.json"
        template.write_text(simulated_verdict_template())
        report = Path(tmp) / "report.json"
        argv = [sys.executable, __file__, "--child", str(args.simulate), "--template", str(template),
                "--report", str(report), "--fanout", str(args.fanout), "--output", args.output,
                "--transport", args.transport]
        t0 = time.perf_counter()
        p = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                             env={**os.environ, "PYTHONPATH": str(ROOT)})
        _, status, usage = os.wait4(p.pid, 0)
        dt = time.perf_counter() - t0
        err = p.stderr.read() if p.stderr else ""
        own_cpu = re.findall(r"SELF_CPU ([0-9.]+)", err)
        rc = os.waitstatus_to_exitcode(status)
        size = report.stat().st_size if report.exists() else 0
        verdict_kb = len(template.read_text()) / 1000
        compact_kb = len(json.dumps(json.loads(re.sub(r"@TF\d@", "700", template.read_text())))) / 1000
    load = os.getloadavg()[0]
    print(f"machine: {platform.node()} {platform.machine()} {os.cpu_count()} cpus, Python {platform.python_version()},"
          f" load {load:.1f}")
    print(f"simulated sweep of {args.simulate} nodes (verdicts of {verdict_kb:.0f} KB on the wire, {compact_kb:.0f} KB "
          f"compact), transport "
          f"{args.transport}, output {args.output}: "
          f"exit {rc}, wall {dt:.1f} s, cpu {usage.ru_utime + usage.ru_stime:.1f} s "
          f"(the sweep process's own: {own_cpu[-1] if own_cpu else '?'} s), "
          f"peak RSS {usage.ru_maxrss / 1024:.0f} MiB"
          + (f", report {size / 1e6:.0f} MB" if size else ""))
    if rc != 0:
        print(err[-2000:], file=sys.stderr)
    return 0 if rc == 0 else 1


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=64)
    ap.add_argument("--fanout", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--simulate", type=int, default=0, metavar="N", help="simulated sweep of N nodes (no sshd)")
    ap.add_argument("--output", choices=["report", "json", "table"], default="report")
    ap.add_argument("--transport", choices=["inprocess", "srun"], default="inprocess",
                    help="inprocess: the injectable runner; srun: ClusterShell's exec worker over a fake srun")
    ap.add_argument("--child", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--template", help=argparse.SUPPRESS)
    ap.add_argument("--report", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args)
    if args.simulate:
        return simulate(args)
    why = sshd_unavailable()
    if why:
        print(f"cannot run: {why}", file=sys.stderr)
        return 2
    names = [f"node{i:02d}" for i in range(1, args.nodes + 1)]
    hosts = {n: f"127.0.0.{i % 4 + 1}" for i, n in enumerate(names)}
    snapshot = str(ROOT / "tests/fixtures/snapshots/h100-healthy.json")
    remote_cmd = f"env PYTHONPATH={ROOT} {sys.executable} -m gpucheck"
    remote_full = f"{remote_cmd} run --json {shlex.join(['--snapshot', snapshot, '--no-history'])}"
    nodeset = f"node[01-{args.nodes:02d}]"
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        h = SshdHarness(root / "sshd", hosts, max_startups=max(256, 4 * args.nodes))
        h.start()
        try:
            env = {**os.environ, "PYTHONPATH": str(ROOT), **h.env()}
            ssh_pool(h, names[:4], "true", 4)  # warm up: host keys, page cache
            sweep(env, nodeset, remote_cmd, snapshot, args.fanout, root / "r.json")
            t_true, t_remote, t_sweep = [], [], []
            for _ in range(args.rounds):
                dt, bad = ssh_pool(h, names, "true", args.fanout)
                assert bad == 0, f"{bad} ssh true failed"
                t_true.append(dt)
                dt, bad = ssh_pool(h, names, remote_full, args.fanout)
                assert bad == 0, f"{bad} remote gpucheck runs failed"
                t_remote.append(dt)
                dt, rc, rep = sweep(env, nodeset, remote_cmd, snapshot, args.fanout, root / "r.json")
                assert rc == 0 and rep["counts"]["pass"] == args.nodes, (rc, rep["counts"])
                t_sweep.append(dt)
        finally:
            h.stop()
    m_true, m_remote, m_sweep = (statistics.median(x) for x in (t_true, t_remote, t_sweep))
    load = os.getloadavg()[0]
    print(f"machine: {platform.node()} {platform.machine()} {os.cpu_count()} cpus, Python {platform.python_version()},"
          f" load {load:.1f}")
    print(f"{args.nodes} nodes, fan-out {args.fanout}, median of {args.rounds} rounds (min in brackets)")
    print(f"ssh true loop          {m_true:7.2f} s  ({min(t_true):.2f})")
    print(f"ssh + remote gpucheck  {m_remote:7.2f} s  ({min(t_remote):.2f})")
    print(f"gpucheck sweep         {m_sweep:7.2f} s  ({min(t_sweep):.2f})")
    print(f"gpucheck's whole cost (sweep - ssh true):        {m_sweep - m_true:6.2f} s"
          f" ({(m_sweep - m_true) / args.nodes * 1000:.0f} ms a node)")
    print(f"sweep machinery (sweep - ssh + remote gpucheck): {m_sweep - m_remote:6.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
