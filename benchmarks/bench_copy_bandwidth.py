"""Copy bandwidth table: H2D, D2H, D2D per GPU and the P2P matrix, as eud.bandwidth measures it.

    python benchmarks/bench_copy_bandwidth.py                       # every GPU, every pair
    python benchmarks/bench_copy_bandwidth.py --h2d 1G --repeats 20 --json
    python benchmarks/bench_copy_bandwidth.py --device cpu --workers 2 --bytes 64M   # host memcpy stand-in

Runs gpucheck.eud.copybw.measure in this process (the code the eud.bandwidth worker runs): per GPU,
`--repeats` timed transfers after 2 warm-ups, median; H2D/D2H between a NUMA-local page-locked host
buffer and the GPU, D2D within the GPU (counted read + write), P2P from each GPU to each other
(bytes once). GPUs are taken from NVML (the same order and PCI bus ids as gpucheck; the bus id gives
the NUMA-local CPUs); without NVML, torch's device order.

Reference points (gpucheck.data.bandwidth): H100/H200 SXM host links >= 48 GB/s each way and peer
copies >= 335 GB/s (Azure's health-check floors), about 50 GB/s typical on PCIe Gen5 x16, an H100
SXM copies about 3.0 TB/s device to device counting reads and writes.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")  # CUDA numbers GPUs like NVML

from gpucheck.eud.copybw import measure  # noqa: E402
from gpucheck.workers.pool import LocalChannel, WorkerJob  # noqa: E402


def parse_bytes(text: str) -> int:
    t = text.strip().upper().removesuffix("B").removesuffix("I")
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(t[-1:], 1)
    return int(float(t[:-1] if t[-1:] in "KMG" else t) * mult)


def nvml_gpus() -> tuple[list[dict], str | None]:
    try:
        from gpucheck.platform.telemetry.snapshot import collect_snapshot

        snap = collect_snapshot(timeout_s=60)
    except Exception as e:  # noqa: BLE001
        return [], f"no NVML snapshot: {e}"
    gpus = [{"gpu": g["index"], "uuid": g.get("uuid"), "bus_id": g.get("pci_bus_id"), "name": g.get("name"),
             "pcie": g.get("pcie")} for g in snap.get("gpus", []) if g.get("state", "ok") == "ok"]
    return gpus, snap.get("driver_version")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--workers", type=int, default=2, help="CPU stand-ins (cpu device)")
    ap.add_argument("--h2d", default="256M", help="bytes per host<->device transfer")
    ap.add_argument("--d2d", default="1G", help="bytes per device-to-device copy")
    ap.add_argument("--p2p", default="256M", help="bytes per peer copy")
    ap.add_argument("--bytes", default=None, help="one size for every transfer (overrides the three above)")
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--no-p2p", action="store_true")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)

    import torch

    sizes = {k: parse_bytes(a.bytes or getattr(a, k)) for k in ("h2d", "d2d", "p2p")}
    env = {"host": platform.node(), "python": platform.python_version(), "torch": torch.__version__,
           "device": a.device}
    if a.device == "cuda":
        gpus, driver = nvml_gpus()
        if not gpus:
            gpus = [{"gpu": i, "name": torch.cuda.get_device_name(i)} for i in range(torch.cuda.device_count())]
        env.update(driver=driver, cuda_runtime=torch.version.cuda, gpus=sorted({g.get("name") for g in gpus}))
    else:
        torch.set_num_threads(1)
        gpus = [{"gpu": i} for i in range(a.workers)]
        env.update(cpu=platform.processor() or platform.machine(), cores=os.cpu_count())
    args = {"gpus": gpus, "h2d_bytes": sizes["h2d"], "d2d_bytes": sizes["d2d"], "p2p_bytes": sizes["p2p"],
            "repeats": a.repeats, "warmup": 2, "p2p": not a.no_p2p, "numa_affinity": True}
    out = measure(torch, a.device, args, LocalChannel(WorkerJob("bench", device=a.device)))
    if a.json:
        print(json.dumps({"env": env, "sizes": sizes, "result": out}, default=str))
        return 0
    print(json.dumps(env))
    print(f"sizes: H2D/D2H {sizes['h2d'] >> 20} MiB, D2D {sizes['d2d'] >> 20} MiB, P2P {sizes['p2p'] >> 20} MiB; "
          f"median of {a.repeats}")
    print("| GPU | name | H2D GB/s | D2H GB/s | D2D GB/s (read+write) | PCIe under load | NUMA node |")
    print("|---|---|---|---|---|---|---|")
    for g in gpus:
        rec = out["gpus"].get(g["gpu"], {})
        if rec.get("error"):
            print(f"| {g['gpu']} | {g.get('name')} | error: {rec['error']} | | | | |")
            continue
        ul = rec.get("link_under_load") or {}
        link = f"Gen{ul.get('gen')} x{ul.get('width')}" if ul.get("gen") is not None else "n/a"
        vals = [f"{rec[k]['gbps']:.2f}" if rec.get(k) else "n/a" for k in ("h2d", "d2h", "d2d")]
        print(f"| {g['gpu']} | {g.get('name') or rec.get('name') or a.device} | {' | '.join(vals)} | {link} | "
              f"{(rec.get('numa') or {}).get('node')} |")
    if out["pairs"]:
        ids = [g["gpu"] for g in gpus]
        by = {(p["src"], p["dst"]): p for p in out["pairs"]}
        print("\nP2P GB/s (row: source, column: destination)")
        print("| src \\ dst | " + " | ".join(map(str, ids)) + " |")
        print("|---|" + "---|" * len(ids))
        for s in ids:
            cells = []
            for d in ids:
                p = by.get((s, d))
                cells.append("-" if s == d or p is None else (f"{p['gbps']:.1f}" if p.get("gbps") else
                                                              ("no access" if p.get("note") else "error")))
            print(f"| {s} | " + " | ".join(cells) + " |")
    else:
        print("\n" + (out.get("p2p_note") or "no P2P pairs"))
    for n in out["notes"]:
        print("note:", n)
    return 0


if __name__ == "__main__":
    sys.exit(main())
