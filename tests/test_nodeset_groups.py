"""Node-set group references never reach a shell: ClusterShell substitutes a group name into a
groups.conf upcall (`map: sinfo -h -o %N -p $GROUP`) run by /bin/sh, as root in a sweep or a
hook, so every `@...` of a node set is checked before ClusterShell sees it, and fold() never
resolves a group at all."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpucheck.platform.nodeset import NodeSetError, group_reference_problem, parse_nodeset

ROOT = Path(__file__).resolve().parents[1]

HOSTILE = [
    "@p1;touch${IFS}PWNED",
    "@rack[1,2];touch${IFS}PWNED",  # a comma inside a range must not hide what follows it
    "@rack[1-2]x;touch${IFS}PWNED",
    "@site:p1;touch${IFS}PWNED",
    "@p1`touch${IFS}PWNED`",
    "@$(touch${IFS}PWNED)",
    "n1,@p1|touch${IFS}PWNED",
    "n1!@p1>PWNED",
]


def _in_a_site(tmp_path: Path, code: str) -> subprocess.CompletedProcess:
    """Run `code` with a ClusterShell groups.conf whose map upcall puts $GROUP in a shell
    unquoted (ClusterShell's own slurm example does)."""
    (tmp_path / "groups.conf").write_text(
        "[Main]\ndefault: site\n\n[site]\nmap: echo n[1-3]; : $GROUP\nall: echo n[1-3]\nlist: echo p1 rack1 rack2\n")
    return subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(ROOT), "CLUSTERSHELL_CFGDIR": str(tmp_path)})


@pytest.mark.parametrize("text", HOSTILE)
def test_a_hostile_group_never_reaches_the_upcall(tmp_path, text):
    code = ("from gpucheck.platform.nodeset import NodeSetError, parse_nodeset\n"
            f"try:\n    parse_nodeset({text!r})\nexcept NodeSetError as e:\n    print(e)\n")
    r = _in_a_site(tmp_path, code)
    assert r.returncode == 0, r.stderr[-600:]
    assert "bad group" in r.stdout
    assert not (tmp_path / "PWNED").exists()


def test_fold_never_resolves_a_group(tmp_path):
    code = ("from gpucheck.platform.nodeset import fold\n"
            "print(fold(['@p1;touch${IFS}PWNED', 'n1', 'n2']))\n")
    r = _in_a_site(tmp_path, code)
    assert r.returncode == 0, r.stderr[-600:]
    assert not (tmp_path / "PWNED").exists()
    assert "n[1-2]" in r.stdout


@pytest.mark.parametrize("text, nodes", [("@p1", "n1,n2,n3"), ("@site:p1", "n1,n2,n3"), ("@rack[1-2]", "n1,n2,n3"),
                                         ("@*", "n1,n2,n3"), ("@site:*", "n1,n2,n3"), ("@p1!n2", "n1,n3"),
                                         (" @p1&n[2-9]", "n2,n3")])
def test_the_sites_groups_still_resolve(tmp_path, text, nodes):
    r = _in_a_site(tmp_path, f"from gpucheck.platform.nodeset import parse_nodeset\nprint(','.join(parse_nodeset({text!r})))\n")
    assert r.returncode == 0 and r.stdout.strip() == nodes, r.stderr[-600:]


@pytest.mark.parametrize("text", ["@p1", "@site:gpu_a100", "@rack[1-4]", "@rack[1,3-4]x[2]", "@*", "@site:*", "@@site",
                                  "@@", "n[1-3],@a!@b&@c^n4", "gpu[001-128]"])
def test_well_formed_group_references_pass_the_check(text):
    assert group_reference_problem(text) is None


@pytest.mark.parametrize("text", ["@", "@:x", "@-x", "@p1 x", "@p1 ,n2", "x@y", "n[1,2]@x", "@rack*", "@a[1",
                                  "@" + "a" * 300, "@a\\b", "@a'b", '@a"b', "@a%b"])
def test_malformed_group_references_are_refused(text):
    assert group_reference_problem(text) is not None
    with pytest.raises(NodeSetError, match="bad group"):
        parse_nodeset(text)
