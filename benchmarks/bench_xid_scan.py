#!/usr/bin/env python3
"""Scan a generated kernel log with gpucheck and with `grep -c NVRM`, in the same run.

    python benchmarks/bench_xid_scan.py                 # 1 GiB log, 0.1% NVRM lines
    python benchmarks/bench_xid_scan.py --size 256M --repeat 5

The log is generated into a temporary folder (deleted afterwards unless --keep): syslog-format
kernel lines (USB, network, systemd, audit, OOM, ... noise) with about 0.1% NVRM lines (Xid
reports in every real form, GSP RPC timeouts, bus losses, NVSwitch SXid triples). gpucheck is
timed as `python -m gpucheck xid --file LOG --no-nvml` (the same code path as the command,
start-up included), grep as `grep -c NVRM LOG`; the page cache is warmed first, each is run
--repeat times and the best and the median are reported. Goal: gpucheck within 3x of grep.
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

NOISE = (
    "usb {a}-{b}: new high-speed USB device number {n} using xhci_hcd",
    "mlx5_core 0000:{bus:02x}:00.0: mlx5_cmd_out_err:838: QUERY_VPORT_COUNTER(0x770) op_mod(0x0) failed, status bad parameter(0x3), syndrome (0x{n:x}), err(-22)",
    "audit: type=1400 audit({t}.{n}:{m}): apparmor=\"DENIED\" operation=\"open\" profile=\"snap.lxd\" name=\"/proc/{n}/mounts\" pid={n} comm=\"lxd\"",
    "IPv6: ADDRCONF(NETDEV_CHANGE): ib{a}: link becomes ready",
    "EXT4-fs (nvme{a}n1p{b}): mounted filesystem with ordered data mode. Quota mode: none.",
    "python3[{n}]: segfault at {m:x} ip 00007f{n:x} sp 00007ffd{m:x} error 4 in libc.so.6[7f1c2a400000+195000]",
    "Memory cgroup out of memory: Killed process {n} (python3) total-vm:{m}kB, anon-rss:{n}kB, file-rss:0kB, shmem-rss:0kB, UID:1000 pgtables:{a}kB oom_score_adj:0",
    "nfs: server storage-{a} not responding, still trying",
    "perf: interrupt took too long ({n} > {m}), lowering kernel.perf_event_max_sample_rate to {a}000",
    "bond0: (slave enp{a}s0f{b}np0): link status definitely up, 100000 Mbps full duplex",
    "docker0: port {a}(veth{n:x}) entered forwarding state",
    "systemd-journald[{n}]: Data hash table of /var/log/journal/system.journal has a fill level at 75.0 ({m} of {n} items), suggesting rotation.",
)

NVRM = (
    "NVRM: Xid (PCI:0000:{bus:02x}:00): 13, pid={n}, name=python3, Graphics Exception: ESR 0x504648=0x102000e 0x504650=0x0",
    "NVRM: Xid (PCI:0000:{bus:02x}:00): 31, pid={n}, name=python3, Ch 00000008, intr 00000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted @ 0x7f_{m:x}. Fault is of type FAULT_PDE ACCESS_TYPE_VIRT_READ",
    "NVRM: Xid (0000:{bus:02x}:00): 31, Ch 0000005a, engmask 00000101, intr 10000000",
    "NVRM: Xid (PCI:0000:{bus:02x}:00): 43, pid={n}, name=python3, Ch 00000008",
    "NVRM: Xid (PCI:0000:{bus:02x}:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.",
    "NVRM: GPU 0000:{bus:02x}:00.0: GPU has fallen off the bus.",
    "NVRM: Xid (PCI:0000:{bus:02x}:00): 48, pid='<unknown>', name=<unknown>, An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at partition 1, subpartition 0.",
    "NVRM: Xid (PCI:0000:{bus:02x}:00 GPU-I:01 GPU-CI:00): 94, pid={n}, name=train.py, Contained: SM (0x1). RST: No, D-RST: No",
    "NVRM: Xid (PCI:0000:{bus:02x}:00): 119, pid={n}, name=nvidia-smi, Timeout after 6s of waiting for RPC response from GPU4 GSP! Expected function 76 (GSP_RM_CONTROL) (0x20803032 0x58c).",
    "NVRM: GPU4 GSP RPC buffer contains function 76 (GSP_RM_CONTROL) and data 0x0000000020803032 0x000000000000058c.",
    "NVRM: Xid (PCI:0018:{bus:02x}:00): 145, RLW_RXPIPE Nonfatal XC0 i0 Link 13 (0x0409a0c2 0x00000008 0x00000001 0x00000000 0x00100000 0x00000004)",
    "NVRM: Xid (PCI:0000:{bus:02x}:00): 154, GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)",
    "NVRM: GPU at PCI:0000:{bus:02x}:00: GPU-509665ad-b600-ac93-3616-d754b23d{n:04x}",
    "nvidia-nvswitch{a}: SXid (PCI:0000:{bus:02x}:00.0): 22013, Non-fatal, Link {b} Minion Link DLREQ interrupt",
)


def parse_size(text: str) -> int:
    s = text.strip().upper().rstrip("B").rstrip("I")
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    if s and s[-1] in mult:
        return int(float(s[:-1]) * mult[s[-1]])
    return int(s)


def generate(path: Path, size: int, fraction: float, seed: int) -> tuple[int, int]:
    """Write about `size` bytes of kernel log; return (lines, relevant lines)."""
    rng = random.Random(seed)
    t0 = time.mktime((2027, 1, 15, 0, 0, 0, 0, 0, -1))
    months = "Jan"
    written = lines = relevant = 0
    mono = 100.0
    buf: list[str] = []
    buf_bytes = 0
    with open(path, "w", encoding="utf-8") as f:
        while written < size:
            mono += rng.random() * 0.01
            wall = time.localtime(t0 + mono)
            a, b, n, m = rng.randrange(1, 9), rng.randrange(0, 64), rng.randrange(1, 99999), rng.randrange(1 << 20)
            bus = rng.choice((0x18, 0x2a, 0x3a, 0x5d, 0x9a, 0xab, 0xba, 0xdb))
            if rng.random() < fraction:
                msg = rng.choice(NVRM).format(a=a, b=b, n=n, m=m, bus=bus)
                relevant += 1
            else:
                msg = rng.choice(NOISE).format(a=a, b=b, n=n, m=m, bus=bus, t=int(t0 + mono))
            line = (f"{months} {wall.tm_mday:2d} {wall.tm_hour:02d}:{wall.tm_min:02d}:{wall.tm_sec:02d} "
                    f"gpu-node-017 kernel: [{mono:12.6f}] {msg}\n")
            buf.append(line)
            buf_bytes += len(line)
            lines += 1
            if buf_bytes >= 1 << 20:
                f.write("".join(buf))
                written += buf_bytes
                buf, buf_bytes = [], 0
        if buf:
            f.write("".join(buf))
    return lines, relevant


def timed(argv: list[str], env: dict[str, str]) -> tuple[float, float, int, bytes]:
    """(wall seconds, CPU seconds of the command and its children, exit code, stdout)."""
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    p = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    wall = time.perf_counter() - t
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    return wall, cpu, p.returncode, p.stdout


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="1G", help="log size, e.g. 1G, 256M (default 1G)")
    ap.add_argument("--fraction", type=float, default=0.001, help="share of NVRM lines (default 0.001)")
    ap.add_argument("--repeat", type=int, default=3, help="timed runs of each (default 3)")
    ap.add_argument("--seed", type=int, default=17)
    ap.add_argument("--dir", help="where to write the log (default: a new temporary folder)")
    ap.add_argument("--keep", action="store_true", help="keep the generated log")
    ap.add_argument("--log", help="time this existing log instead of generating one (never deleted)")
    args = ap.parse_args()
    size = parse_size(args.size)

    if args.log:
        tmp, log = None, Path(args.log)
    else:
        tmp = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="gpucheck-bench-xid-"))
        tmp.mkdir(parents=True, exist_ok=True)
        log = tmp / "kern.log"
    try:
        if tmp is not None:
            t = time.perf_counter()
            nlines, nrel = generate(log, size, args.fraction, args.seed)
            gen_s = time.perf_counter() - t
            print(f"generated {log.stat().st_size / (1 << 30):.3f} GiB, {nlines} lines, {nrel} NVRM/NVSwitch "
                  f"lines ({100 * nrel / nlines:.3f}%) in {gen_s:.1f} s: {log}")
        else:
            print(f"using {log} ({log.stat().st_size / (1 << 30):.3f} GiB)")

        env = dict(os.environ)
        env["PYTHONPATH"] = str(REPO) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        grep = ["grep", "-c", "NVRM", str(log)]
        ours = [sys.executable, "-m", "gpucheck", "xid", "--file", str(log), "--no-nvml"]
        timed(grep, env)  # warm the page cache
        g_times, o_times, g_cpu, o_cpu = [], [], [], []
        g_count = rc = None
        for _ in range(args.repeat):
            dt, cpu, _, out = timed(grep, env)
            g_times.append(dt)
            g_cpu.append(cpu)
            g_count = int(out.strip() or 0)
            dt, cpu, rc, out = timed(ours, env)
            o_times.append(dt)
            o_cpu.append(cpu)
            if rc not in (0, 1):
                print(f"gpucheck xid failed (exit {rc}):\n{out.decode(errors='replace')[-2000:]}")
                return 1
        # The same scan in-process, without interpreter start-up and output, for the breakdown.
        sys.path.insert(0, str(REPO))
        from gpucheck.platform.kernlog.scan import scan

        t = time.perf_counter()
        sc = scan(files=[str(log)], since="all")
        inproc = time.perf_counter() - t

        gb, gm = min(g_times), statistics.median(g_times)
        ob, om = min(o_times), statistics.median(o_times)
        load = " ".join(f"{x:.2f}" for x in os.getloadavg())
        print(f"machine: {platform.node()} {platform.machine()}, {os.cpu_count()} CPUs, "
              f"Python {platform.python_version()}, {platform.platform()}; load average {load}")
        print(f"grep -c NVRM            : wall best {gb:.3f} s, median {gm:.3f} s; "
              f"CPU best {min(g_cpu):.3f} s (count {g_count})")
        print(f"gpucheck xid --file     : wall best {ob:.3f} s, median {om:.3f} s; "
              f"CPU best {min(o_cpu):.3f} s, all processes (exit {rc})")
        print(f"  in-process scan only  : {inproc:.3f} s; {len(sc.events)} Xid events, "
              f"{len(sc.sxid_events)} SXid events, {len(sc.unrecognised)} unrecognised, "
              f"{sc.parsed.lines} relevant lines")
        print(f"ratio gpucheck / grep   : wall best {ob / gb:.2f}x, median {om / gm:.2f}x; "
              f"CPU {min(o_cpu) / min(g_cpu):.2f}x (goal <= 3x wall: {'met' if om / gm <= 3 else 'NOT met'})")
        return 0
    finally:
        if tmp is None:
            pass
        elif args.keep:
            print(f"kept {log}")
        elif not args.dir:
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            log.unlink(missing_ok=True)


if __name__ == "__main__":
    sys.exit(main())
