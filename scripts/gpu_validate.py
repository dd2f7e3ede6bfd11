"""The Python half of scripts/gpu-validate.sh (standard library only, no gpucheck import).

    python3 scripts/gpu_validate.py env                # versions, the GPU, what must travel as wheels
    python3 scripts/gpu_validate.py figures STEP DIR   # one line: the key figures of STEP's outputs in DIR

`env` imports every module a step of the kit needs and says which are missing, each with the
`pip download` line that fetches its wheel where an index can be reached (to carry to the GPU
machine and install with `gpu-validate.sh --wheels DIR`); the modules no step needs (ClusterShell:
the fleet commands over ssh/srun and Slurm node lists; jsonschema: the CPU suite's schema tests)
are named as such. `figures` reads what a step left in DIR (its log, JSON, junit XML) and prints
the figures that benchmarks/RESULTS.md lists as open, or nothing when there are none to read.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import json
import platform
import re
import sys
import warnings
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]

# module, distribution, what needs it
NEEDED: tuple[tuple[str, str, str], ...] = (
    ("torch", "torch", "GPU tests, benchmarks, the burn/poet/memtest/bandwidth workers"),
    ("cupy", "cupy-cuda13x", "the CUDA kernels (POET, memtest)"),
    ("pynvml", "nvidia-ml-py", "gpucheck's NVML reads (telemetry, every check)"),
    ("numpy", "numpy", "memtest, the GPU tests"),
    ("pytest", "pytest", "the pytest-* steps"),
    ("click", "click", "the gpucheck CLI"),
    ("rich", "rich", "the gpucheck CLI's tables"),
    ("psutil", "psutil", "gpucheck's process handling"),
)
NOT_NEEDED: tuple[tuple[str, str, str], ...] = (
    ("ClusterShell", "ClusterShell", "only the fleet commands over ssh/srun and Slurm node lists"),
    ("jsonschema", "jsonschema", "only the CPU suite's schema tests"),
)


def _version(module: str, dist: str) -> str | None:
    """The installed version of `dist` when `module` imports, else None."""
    try:
        m = importlib.import_module(module)
    except Exception:  # noqa: BLE001 - any import failure means: not usable here
        return None
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:  # another distribution of it (cupy-cuda12x, ...)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return str(getattr(m, "__version__", "?"))


def wheel_command(dist: str) -> str:
    """The line that fetches `dist`'s wheel for this machine's Python, where an index is reachable."""
    py = f"{sys.version_info.major}.{sys.version_info.minor}"
    plats = " ".join(f"--platform {p}" for p in ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64",
                                                   "manylinux2014_x86_64"))
    return (f"python3 -m pip download --no-deps --only-binary=:all: --python-version {py} --implementation cp "
            f"{plats} -d .whl {dist}")


def _torch_lines() -> list[str]:
    try:
        import torch
    except Exception as e:  # noqa: BLE001
        return [f"torch: not importable: {e}"]
    lines = [f"torch cuda {torch.version.cuda} available {torch.cuda.is_available()}"]
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            lines.append(f"gpu{i} {p.name} sm_{p.major}{p.minor} {p.multi_processor_count} SMs {p.total_memory} bytes")
    return lines


def _nvrtc_line() -> str:
    sys.path.insert(0, str(ROOT / "tests"))
    try:
        import nvrtc

        lib = nvrtc.find_library()
    except Exception as e:  # noqa: BLE001
        return f"libnvrtc: not checked: {e}"
    return f"libnvrtc: {lib or 'not found (bench-poet (c) is not measured)'}"


def env() -> int:
    print("python", platform.python_version(), sys.executable)
    missing = []
    for module, dist, why in NEEDED:
        v = _version(module, dist)
        print(f"{module} {v if v is not None else 'MISSING'} ({dist}: {why})")
        if v is None:
            missing.append(dist)
    for module, dist, why in NOT_NEEDED:
        v = _version(module, dist)
        print(f"{module} {v if v is not None else 'absent'}: not needed by any step ({why})")
    print(*_torch_lines(), sep="\n")
    print(_nvrtc_line())
    if not missing:
        print("missing: none: no wheel must travel")
        return 0
    print("missing: " + " ".join(missing))
    for dist in missing:
        print(f"carry its wheel: {wheel_command(dist)}")
    print("then name .whl in the device tool's carry and add --wheels .whl to the kit's command")
    return 1


# -- figures ----------------------------------------------------------------------------------------

def _json(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _text(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def _f(x, digits: int = 2) -> str:
    return f"{x:.{digits}f}" if isinstance(x, (int, float)) else "?"


def fig_env(d: Path) -> str:
    log = _text(d / "env.log")
    out = [m.group(1) for m in re.finditer(r"^gpu\d+ (.+?) \d+ SMs", log, re.M)][:1]
    m = re.search(r"^\s*Driver Version\s*:\s*(\S+)", _text(d / "nvidia-smi-q.txt"), re.M)
    out += [f"driver {m.group(1)}"] if m else []
    out += [m.group(0) for m in re.finditer(r"^(torch|cupy) \S+(?= \()", log, re.M)]
    m = re.search(r"^missing: (.*)$", log, re.M)
    out += [f"missing {m.group(1)}"] if m else []
    return ", ".join(out)


def fig_telemetry(d: Path) -> str:
    snap = _json(d / "telemetry.json")
    if not isinstance(snap, dict):
        return ""
    names = sorted({str(g.get("name")) for g in snap.get("gpus") or []})
    return (f"{len(snap.get('gpus') or [])} GPU(s) {', '.join(names)}; driver {snap.get('driver_version')}; "
            f"nvml ok {(snap.get('nvml') or {}).get('ok')}")


def _verdict(path: Path) -> str:
    v = _json(path)
    if not isinstance(v, dict):
        return ""
    slow = sorted(v.get("checks") or [], key=lambda c: -(c.get("duration_s") or 0))[:3]
    return (f"{v.get('status')} exit {v.get('exit_code')} in {_f(v.get('duration_s'), 1)} s, partial "
            f"{v.get('partial')}, counts {v.get('counts')}; slowest "
            + ", ".join(f"{c.get('id')} {_f(c.get('duration_s'), 1)} s {c.get('status')}" for c in slow))


def pytest_counts(log: str) -> str:
    """pytest's own last line ("2 failed, 60 passed in 97.1s") or, for a run cut short, the results
    printed so far by -v (each test's word after its node id, or alone on a line after -s output)."""
    last = re.findall(r"^=+ (\d+ \w+.*) in [\d.]+s\b.*=+$", log, re.M)
    if last:
        return last[-1]
    words = re.findall(r"(?:::\S+ |^)(PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)\b", log, re.M)
    counts = {w: words.count(w) for w in dict.fromkeys(words)}
    return (", ".join(f"{n} {w.lower()}" for w, n in counts.items()) or "no test result") + " (cut short)"


def fig_pytest(d: Path, name: str) -> str:
    log = _text(d / f"{name}.log")
    out = [pytest_counts(log)]
    tc = re.findall(r"(bf16|fp16) b=(\d+): tensor cores .*?ratio vs bmm\+gather ([\d.]+)", log)
    if tc:
        out.append("TC/bmm+gather " + " ".join(f"{dt}/{b} {r}" for dt, b, r in tc))
    out += [f"memtest/copy {m.group(1)}" for m in re.finditer(r"D2D copy .*?ratio ([\d.]+)", log)]
    out += [m.group(0) for m in re.finditer(r"\d+\.\d+% of the tensor-core outputs differ", log)]
    return "; ".join(out)


def fig_bench_poet(d: Path) -> str:
    table_a = re.search(r"^## \(a\).*?(?=^## |\Z)", _text(d / "bench-poet.log"), re.M | re.S)
    rows = re.findall(r"^\| (bf16|fp16|fp32) \| (\d+) \| [^|]+\| [^|]+\| [^|]+\| [^|]+\| ([\d.]+|—) \|",
                      table_a.group(0) if table_a else "", re.M)
    if not rows:
        return ""
    return "TC vs bmm+gather (goal >= 1.0 at b <= 128): " + ", ".join(f"{dt} b{b} {r}" for dt, b, r in rows)


def fig_burn(d: Path, name: str) -> str:
    doc = _json(d / f"{name}.json")
    if not isinstance(doc, dict):
        return ""
    return "burn/bare (goal >= 0.97): " + ", ".join(f"{r.get('dtype')} {_f(r.get('ratio'), 3)}"
                                                  for r in doc.get("dtypes") or [])


def fig_memtest(d: Path) -> str:
    doc = _json(d / "bench-memtest.json")
    if not isinstance(doc, dict):
        return ""
    return (f"memtest {_f(doc.get('memtest_gbps'), 0)} GB/s vs D2D copy {_f(doc.get('copy_gbps'), 0)} GB/s: "
            f"ratio {_f(doc.get('ratio'), 3)} (goal >= 0.9)")


def fig_copy(d: Path) -> str:
    doc = _json(d / "bench-copy.json")
    if not isinstance(doc, dict):
        return ""
    gpus = (doc.get("result") or {}).get("gpus") or {}
    if not gpus:
        return "no GPU measured"
    return "; ".join(f"gpu{g} h2d {_f((r.get('h2d') or {}).get('gbps'), 1)} d2h {_f((r.get('d2h') or {}).get('gbps'), 1)}"
                     f" d2d {_f((r.get('d2d') or {}).get('gbps'), 0)} GB/s" for g, r in sorted(gpus.items()))


def fig_allreduce(d: Path) -> str:
    doc = _json(d / "bench-allreduce.json")
    rows = (doc or {}).get("rows") or [] if isinstance(doc, dict) else []
    return "gpucheck/bare (goal <= 1.05): " + ", ".join(f"{r.get('size')} B {_f(r.get('ratio_vs_bare_median'), 3)}"
                                                      for r in rows) if rows else ""


def fig_level1_bench(d: Path) -> str:
    return "; ".join(m.group(0).strip() for m in re.finditer(r"^(no time limit|--timeout \S+)\s+wall median .*?s(?= \|)",
                                                             _text(d / "bench-level1.log"), re.M))


def fig_sass(d: Path) -> str:
    log = _text(d / "sass.log")
    out = []
    for block in re.split(r"^== ", log, flags=re.M)[1:]:
        regs = [int(x) for x in re.findall(r"Used (\d+) registers", block)]
        spills = sum(int(a) + int(b) for a, b in re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", block))
        if regs:
            out.append(f"{block.split(None, 1)[0]} {len(regs)} kernels, max {max(regs)} registers, {spills} spill bytes")
    return "; ".join(out)


FIGURES: dict[str, Callable[[Path], str]] = {
    "env": fig_env,
    "telemetry": fig_telemetry,
    "run-level1": lambda d: _verdict(d / "run-level1.json"),
    "run-level2": lambda d: _verdict(d / "run-level2.json"),
    "bench-poet": fig_bench_poet,
    "bench-memtest": fig_memtest,
    "bench-burn": lambda d: fig_burn(d, "bench-burn"),
    "bench-burn-more": lambda d: fig_burn(d, "bench-burn-more"),
    "bench-copy": fig_copy,
    "bench-allreduce": fig_allreduce,
    "bench-level1": fig_level1_bench,
    "sass": fig_sass,
}


def figures(step: str, d: Path) -> str:
    fn = FIGURES.get(step)
    if fn is None:
        return fig_pytest(d, step) if step.startswith("pytest-") else ""
    return fn(d)


def main(argv: list[str]) -> int:
    if argv[:1] == ["env"] and len(argv) == 1:
        return env()
    if argv[:1] == ["figures"] and len(argv) == 3:
        line = " ".join(figures(argv[1], Path(argv[2])).split())
        print(line.replace("|", "/")[:300])
        return 0
    print("usage: gpu_validate.py env | figures STEP DIR", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
