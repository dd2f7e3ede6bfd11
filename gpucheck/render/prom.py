"""Prometheus textfile-collector output (node_exporter --collector.textfile.directory).

One gauge per check and subject for the status, the overall verdict, and every numeric metric of
every result. Written through a temporary file and a rename so node_exporter never reads half a
file (gpucheck.platform.safeio.write_output: what it refuses, modes).
"""

from __future__ import annotations

import math
import re
from typing import Any

from ..core.result import Status
from ..core.verdict import Verdict
from ..platform.safeio import write_output

_STATUS_VALUE = {Status.PASS: 0, Status.WARN: 1, Status.FAIL: 2, Status.ERROR: 3, Status.SKIP: -1}
_NAME_RE = re.compile(r"[^a-zA-Z0-9_]")


def _metric_name(text: str) -> str:
    name = _NAME_RE.sub("_", text).strip("_").lower()
    return name if name and not name[0].isdigit() else f"m_{name}"


def _label(value: Any) -> str:
    return str(value).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(**kw: Any) -> str:
    return "{" + ",".join(f'{k}="{_label(v)}"' for k, v in kw.items() if v is not None) + "}"


def render(verdict: Verdict) -> str:
    host = verdict.host
    lines = [
        "# HELP gpucheck_verdict_status Overall node status: 0 pass, 1 warn, 2 fail, 3 error, -1 skip.",
        "# TYPE gpucheck_verdict_status gauge",
        f'gpucheck_verdict_status{_labels(host=host, level=int(verdict.level), action=verdict.action.value)} '
        f'{_STATUS_VALUE[verdict.status]}',
        "# HELP gpucheck_verdict_timestamp_seconds Unix time of the run's end.",
        "# TYPE gpucheck_verdict_timestamp_seconds gauge",
    ]
    from datetime import datetime

    end = datetime.fromisoformat(verdict.time.replace("Z", "+00:00")).timestamp() + verdict.duration_s
    lines.append(f"gpucheck_verdict_timestamp_seconds{_labels(host=host)} {end:.3f}")
    lines += [
        "# HELP gpucheck_check_status Per check and subject: 0 pass, 1 warn, 2 fail, 3 error, -1 skip.",
        "# TYPE gpucheck_check_status gauge",
    ]
    metric_lines: dict[str, list[str]] = {}
    for r in verdict.results:
        base = dict(host=host, check=r.check, subject=r.subject, gpu=r.gpu)
        lines.append(f"gpucheck_check_status{_labels(**base, action=r.action.value)} {_STATUS_VALUE[r.status]}")
        for mname, m in r.metrics.items():
            v = int(m.value) if isinstance(m.value, bool) else m.value
            if not isinstance(v, (int, float)) or not math.isfinite(v):
                continue
            name = "gpucheck_metric_" + _metric_name(mname)
            if m.unit not in ("count", ""):
                name += "_" + _metric_name(m.unit)
            metric_lines.setdefault(name, []).append(f"{name}{_labels(**base)} {v}")
    for name in sorted(metric_lines):
        lines.append(f"# TYPE {name} gauge")
        lines.extend(metric_lines[name])
    return "\n".join(lines) + "\n"


def write_prom(path: str, verdict: Verdict) -> None:
    write_output(path, render(verdict))
