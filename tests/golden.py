"""Golden verdict files are reviewed values: a person accepts each one.

tests/fixtures/verdicts/*.json are whole verdicts the CLI must reproduce (tests/test_cli.py).
GPUCHECK_REGEN_GOLDEN=1 rewrites them from the code under test, which proves nothing by itself:
so every golden file's SHA-256 is recorded in tests/fixtures/verdicts/ACCEPTED (the format of
`sha256sum`, so `sha256sum -c ACCEPTED` checks it too), and a test fails while a file differs from
its accepted checksum. Regenerating never touches ACCEPTED; accepting is this separate step, after
reading the change:

    git diff tests/fixtures/verdicts/            # review what changed in the verdicts
    python3 tests/golden.py                      # list the files not accepted
    python3 tests/golden.py --accept NAME...     # accept them (or --accept-all)
"""

from __future__ import annotations

import argparse
import hashlib
import sys
from pathlib import Path

VERDICTS = Path(__file__).resolve().parent / "fixtures" / "verdicts"
ACCEPTED = "ACCEPTED"


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def accepted(folder: Path = VERDICTS) -> dict[str, str]:
    """name -> accepted SHA-256."""
    out: dict[str, str] = {}
    path = folder / ACCEPTED
    if not path.exists():
        return out
    for line in path.read_text().splitlines():
        if line.strip():
            value, name = line.split(maxsplit=1)
            out[name.strip()] = value
    return out


def golden_files(folder: Path = VERDICTS) -> list[Path]:
    return sorted(folder.glob("*.json"))


def not_accepted(folder: Path = VERDICTS) -> list[str]:
    """Why each golden file (or ACCEPTED entry) is not an accepted value; empty when all are."""
    acc = accepted(folder)
    problems = []
    for path in golden_files(folder):
        if path.name not in acc:
            problems.append(f"{path.name}: never accepted")
        elif acc[path.name] != digest(path):
            problems.append(f"{path.name}: changed since it was accepted")
    names = {p.name for p in golden_files(folder)}
    problems.extend(f"{name}: accepted but no longer there" for name in sorted(set(acc) - names))
    return problems


def accept(names: list[str], folder: Path = VERDICTS) -> None:
    """Record the current checksum of each named golden file (every one when `names` is empty)."""
    acc = accepted(folder)
    present = {p.name: p for p in golden_files(folder)}
    for name in names or list(present):
        if name not in present:
            raise SystemExit(f"golden.py: no golden file {name!r} in {folder}")
        acc[name] = digest(present[name])
    acc = {n: d for n, d in acc.items() if n in present}
    (folder / ACCEPTED).write_text("".join(f"{d}  {n}\n" for n, d in sorted(acc.items())))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="List or accept the golden verdict files (tests/fixtures/verdicts).")
    ap.add_argument("--accept", nargs="+", metavar="NAME", help="accept these files as they are now")
    ap.add_argument("--accept-all", action="store_true", help="accept every golden file as it is now")
    args = ap.parse_args(argv)
    if args.accept or args.accept_all:
        accept([] if args.accept_all else args.accept)
    problems = not_accepted()
    for p in problems:
        print(p)
    if not problems:
        print("every golden verdict file is accepted")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
