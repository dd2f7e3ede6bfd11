"""`gpucheck report` at fleet size (issue 17: 1,000 nodes render in under 5 s and the page opens
in a browser in under 2 s).

    python benchmarks/bench_report.py [--nodes 1000] [--runs 3] [--kinds sweep,pairs,bisect]

Inputs are made with tests/report_inputs.py (gpucheck's own sweep, pairs and bisect code fed
synthetic measurements): a sweep report of N nodes, each with its whole verdict (the level-1
fixture verdict plus a burn result per GPU, about 86 KB a node), an `nccl pairs` document of N
nodes (3 random rounds: the N x N matrix) and a bisection of N nodes with one bad node.

Timed:
  render    `gpucheck.report.build_report([FILE])` in this process: reading, parsing and
            checking the input, every section and figure, the page (median of --runs; wall
            time and CPU time, which a shared machine disturbs less)
  open      the page in headless Chromium (tests/chromium.py): performance.now() when every
            plot has rendered (window.gpucheckRendered), and when plotly.js was ready; the first
            load in a fresh browser (cold: plotly.js compiled from scratch) and the median of
            --runs reloads (warm: V8's code cache); the first paint of the cold open (the page's
            text and tables, drawn before plotly.js is compiled); and the CPU time all of
            Chromium's processes spent on the cold open (utime + stime of its session, /proc)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]


def make_input(kind: str, nodes: int, folder: Path) -> Path:
    import report_inputs as ri

    path = folder / f"{kind}-{nodes}.json"
    if kind == "sweep":
        path.write_text(ri.sweep_report(nodes))
    elif kind == "pairs":
        path.write_text(json.dumps(ri.pairs_document(nodes)))
    else:
        path.write_text(json.dumps(ri.bisect_result(nodes, (f"n{nodes // 2 + 17:03d}",))))
    return path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--kinds", default="sweep,pairs,bisect")
    args = ap.parse_args()
    import chromium
    from gpucheck.report import build_report

    print(f"load average at start: {os.getloadavg()[0]:.2f}")
    print("| input | input size | render (median) | render CPU | page size | first paint (cold) | open cold "
          "| open cold CPU | open warm (median) | plotly.js ready (warm) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        with chromium.Chromium() as browser:
            for kind in args.kinds.split(","):
                src = make_input(kind, args.nodes, folder)
                times, cpu, page = [], [], ""
                for _ in range(args.runs):
                    t0, c0 = time.perf_counter(), time.process_time()
                    page = build_report([str(src)])
                    times.append(time.perf_counter() - t0)
                    cpu.append(time.process_time() - c0)
                html = folder / f"{kind}.html"
                html.write_text(page)
                c0 = session_cpu(browser.proc.pid)
                cold = browser.open(html)
                cold_cpu = session_cpu(browser.proc.pid) - c0
                paint = float(browser._eval("(performance.getEntriesByType('paint')[0] || {startTime: NaN}).startTime"))
                assert not cold.errors and cold.render_ms is not None, cold.errors
                warm = [browser.open(html) for _ in range(args.runs)]
                ready = statistics.median(browser_ready(browser) for _ in [0])
                print(f"| {kind}, {args.nodes} nodes | {src.stat().st_size / 1e6:.1f} MB | "
                      f"{statistics.median(times):.2f} s | {statistics.median(cpu):.2f} s | {len(page) / 1e6:.1f} MB | "
                      f"{paint / 1e3:.2f} s | {cold.render_ms / 1e3:.2f} s | "
                      f"{cold_cpu:.2f} s | "
                      f"{statistics.median(p.render_ms for p in warm) / 1e3:.2f} s | {ready / 1e3:.2f} s |")
    print(f"load average at end: {os.getloadavg()[0]:.2f}")
    return 0


def session_cpu(sid: int) -> float:
    """CPU seconds (user + system) of every process in session `sid` (Chromium's)."""
    total = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == sid:  # field 6 of stat: the session id
            total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14, 15)
    return total / os.sysconf("SC_CLK_TCK")


def browser_ready(browser) -> float:
    return float(browser._eval("window.gpucheckPlotlyReady"))


if __name__ == "__main__":
    sys.exit(main())
