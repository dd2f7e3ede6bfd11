"""Hostile input to the fleet commands: node names that carry shell syntax or pass for options,
templates that put a placeholder where quoting cannot protect it, node sets and GPU lists too
large to expand, and nodes that answer with something that is not a trustworthy verdict.

The shell-injection tests run the real commands (ClusterShell's exec worker, /bin/sh, the
launcher's argv) against a fake srun, a fake gpucheck or a plain shell, and check that no file
appears."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpucheck.app import UsageError, parse_gpu_list
from gpucheck.cli.main import main
from gpucheck.platform import fanout
from gpucheck.fleet.bisect import CommandTest
from gpucheck.platform.nodeset import MAX_NODES, NodeSetError, parse_nodeset
from gpucheck.fleet.sweep import classify, parse_verdict
from gpucheck.core.verdict import verdict_problem
from gpucheck.nccl.launch import DEFAULT_SSH, Launcher, parse_addrs

ROOT = Path(__file__).resolve().parents[1]
SNAPS = ROOT / "tests" / "fixtures" / "snapshots"

# A fake srun: records its argv (one JSON line per call), then runs the step's command locally
# with the node's name in $FAKE_NODE.
FAKE_SRUN = r"""#!/bin/sh
python3 -c 'import json, sys; print(json.dumps(sys.argv[1:]))' "$@" >> "$FAKE_LOG"
node=""
while [ $# -gt 0 ]; do
  case "$1" in
    --nodelist=*) node="${1#--nodelist=}" ;;
    /bin/sh) break ;;
  esac
  shift
done
FAKE_NODE="$node" exec "$@"
"""

# A fake gpucheck on the nodes: prints the node's canned answer and exits with its code.
FAKE_GPUCHECK = r"""#!/bin/sh
cat "$FAKE_DIR/$FAKE_NODE.out"
exit "$(cat "$FAKE_DIR/$FAKE_NODE.rc" 2>/dev/null || echo 0)"
"""


def hostile(target: Path) -> list[str]:
    """Node names that would run `touch target` (or pass for an ssh option) if they reached a shell."""
    return [f"n1;touch${{IFS}}{target};#", f"n1$(touch${{IFS}}{target})", f"n1`touch${{IFS}}{target}`",
            f"n1|touch${{IFS}}{target}", f"-oProxyCommand=touch${{IFS}}{target}"]


@pytest.fixture
def fake_bin(tmp_path, monkeypatch):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "srun").write_text(FAKE_SRUN)
    (bindir / "gpucheck-fake").write_text(FAKE_GPUCHECK)
    for f in bindir.iterdir():
        f.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}:{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_LOG", str(tmp_path / "srun.log"))
    monkeypatch.setenv("FAKE_DIR", str(tmp_path / "answers"))
    (tmp_path / "answers").mkdir()
    return bindir


def one_error_line(capsys, *words: str) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    for w in words:
        assert w in err[0], err[0]
    return err[0]


# -- 1, 2: hostile node names never reach a shell or ssh as an option ---------------------------

@pytest.mark.parametrize("index", range(5))
@pytest.mark.parametrize("command", ["sweep-srun", "resume-srun", "bisect-test", "pairs-launcher", "sweep-ssh"])
def test_hostile_node_name_is_exit_2_and_runs_nothing(tmp_path, fake_bin, capsys, command, index):
    target = tmp_path / "pwned"
    name = hostile(target)[index]
    argv = {  # options first, then `--`: a name starting with '-' reaches the NODESET argument
        "sweep-srun": ["sweep", "--srun", "--remote-cmd", "gpucheck-fake", "--timeout", "20s", "--", name],
        "sweep-ssh": ["sweep", "--ssh-options", "-F /dev/null", "--connect-timeout", "1s", "--timeout", "5s", "--",
                      name],
        "resume-srun": ["slurm", "resume", "--srun", "--scontrol", str(fake_bin / "srun"), "--", name],
        "bisect-test": ["bisect", "--test", "sh -c 'true {nodes}'", "--test-timeout", "10s", "--", f"{name},n2"],
        "pairs-launcher": ["nccl", "pairs", "--launcher", "sh -c 'true {host}; exec {qcmd}'", "--pair-timeout",
                           "10s", "--", f"{name},n2"],
    }[command]
    assert main(argv) == 2
    one_error_line(capsys, "error", "node name")
    assert not target.exists()
    assert not (tmp_path / "srun.log").exists()


@pytest.mark.parametrize("argv, words", [
    (["sweep", "n[1-2]", "--node-args", "-x=--strict"], "starts with '-'"),
    (["nccl", "pairs", "n[1-4]", "--strategy", "suspects", "--good", "-n1"], "starts with '-'"),
    (["nccl", "pairs", "n[1-4]", "--strategy", "suspects", "--good", "n1", "--suspects", "n2;id"], "character"),
    (["nccl", "pairs", "n[1-4]", "--addr", "n1=-oProxyCommand=id"], "not an IP address or a host name"),
    (["nccl", "pairs", "n[1-4]", "--addr", "n1;id=10.0.0.1"], "character"),
    (["bisect", "n[1-4]", "--builtin", "allreduce", "--addr", "n1=$(id)"], "not an IP address or a host name"),
])
def test_every_node_set_option_checks_names(capsys, argv, words):
    assert main(argv) == 2
    one_error_line(capsys, "error", words)


def test_srun_command_quotes_the_node_name_even_unchecked(tmp_path, fake_bin):
    """ClusterShell substitutes %h into a line that a shell runs: the name stands quoted there,
    so even a name that escaped the check runs nothing (defence in depth)."""
    from ClusterShell.Worker.Exec import _replace_cmd

    target = tmp_path / "pwned"
    name = f"n1;touch${{IFS}}{target};#"
    line = _replace_cmd(fanout.srun_command("true", fanout.SrunSettings(), 60), name, 0)
    subprocess.run(line, shell=True, check=True, timeout=60)
    assert not target.exists()
    (argv,) = [json.loads(x) for x in (tmp_path / "srun.log").read_text().splitlines()]
    assert f"--nodelist={name}" in argv


def test_fanout_refuses_unchecked_names():
    with pytest.raises(ValueError, match="starts with '-'"):
        fanout.run_nodes({"-oProxyCommand=id": "true"}, mode="exec")
    with pytest.raises(ValueError, match="character"):
        fanout.run_nodes({"n1;id": "true"}, mode="exec")


def test_launcher_values_are_quoted_inside_words(tmp_path):
    target = tmp_path / "pwned"
    cmd = ["printf", "%s|", "a b", f"$(touch {target})"]
    lau = Launcher("sh -c 'echo {host} {addr}; exec {qcmd}'", addrs={"n1": "10.0.0.1"})
    lau.validate()
    p = subprocess.run(lau.argv("n1", cmd), capture_output=True, text=True, timeout=60)
    assert p.stdout == f"n1 10.0.0.1\na b|$(touch {target})|" and not target.exists()
    for name in hostile(target):
        with pytest.raises(ValueError):
            lau.argv(name, cmd)
    assert not target.exists()
    # ssh never reads the host as an option: `--` stands before it in the default template
    argv = Launcher(DEFAULT_SSH).argv("n1", cmd)
    assert argv[argv.index("n1") - 1] == "--"


@pytest.mark.parametrize("template", [
    "sh -c 'echo \"{host}\"; exec {qcmd}'",
    "ssh {host} \"echo '{addr}'; {qcmd}\"",
    "sh -c 'echo \\{host}; exec {qcmd}'",
    "bash -c \"echo $'{host}'; {qcmd}\"",
])
def test_launcher_refuses_a_placeholder_inside_quotes(template, capsys):
    with pytest.raises(ValueError, match="inside a quoted string"):
        Launcher(template).validate()
    assert main(["nccl", "pairs", "n[1-2]", "--launcher", template]) == 2
    one_error_line(capsys, "--launcher", "quoted string")


def test_bisect_test_command_is_quoted_and_refuses_quoted_placeholders(tmp_path, capsys):
    for template in ("sh -c 'srun -w {nodes} ./replay'", 'echo "{nodes_comma}"', "echo \\{nodes}",
                     "sh -c 'echo {count}' {nodes}"):
        with pytest.raises(ValueError, match="inside a quoted string"):
            CommandTest(template)
    assert main(["bisect", "n[1-4]", "--test", "sh -c 'srun -w {nodes} ./replay'"]) == 2
    one_error_line(capsys, "--test", "quoted string")
    # bare placeholders: substituted quoted, never globbed or split
    (tmp_path / "n1").write_text("")
    out = tmp_path / "out"
    test = CommandTest(f"cd {shlex.quote(str(tmp_path))} && printf '%s\\n' {{nodes}} {{nodes_comma}} {{count}} > out")
    assert test(["n1", "n2"]).healthy
    assert out.read_text().splitlines() == ["n[1-2]", "n1,n2", "2"]
    test = CommandTest("sh -c 'printf \"%s\\n\" \"$1\" > \"$2\"' sh {nodes} " + shlex.quote(str(out)))
    assert test(["n1", "n3"]).healthy and out.read_text() == "n[1,3]\n"


def test_addresses_are_checked():
    assert parse_addrs(["a=10.0.0.1", "b=fe80::1%eth0", "c=node-c.example.com"]) == {
        "a": "10.0.0.1", "b": "fe80::1%eth0", "c": "node-c.example.com"}
    for bad in ("a=-oProxyCommand=id", "a=$(id)", "a=10.0.0.1;id", "-a=10.0.0.1", "a b=10.0.0.1", "a=x y"):
        with pytest.raises(ValueError):
            parse_addrs([bad])


# -- 3: sizes are checked before anything is expanded -------------------------------------------

@pytest.mark.slow
def test_node_set_size_is_checked_before_expanding():
    t0 = time.monotonic()
    for text in ("n[1-100000000]", "n[1-2000000]", "n[1-100000]-[1-100000]", "a[1-600000],b[1-600000]",
                 "n[1-99999999999999999999]"):
        with pytest.raises(NodeSetError, match="nodes"):
            parse_nodeset(text)
    assert time.monotonic() - t0 < 30  # today's code took minutes (and gigabytes) for the first
    assert len(parse_nodeset("n[1-1000]-[1-1000]")) == MAX_NODES
    assert parse_nodeset("n[1-10/3]") == ["n1", "n4", "n7", "n10"]


@pytest.mark.parametrize("argv", [["sweep", "n[1-100000000]"], ["bisect", "n[1-100000000]", "--test", "x {nodes}"],
                                  ["nccl", "pairs", "n[1-100000000]"], ["slurm", "resume", "n[1-100000000]"]])
def test_huge_node_set_is_exit_2_at_once(capsys, argv):
    t0 = time.monotonic()
    assert main(argv) == 2
    assert time.monotonic() - t0 < 30
    one_error_line(capsys, "1,000,000")


def test_gpu_list_limits():
    t0 = time.monotonic()
    for text in ("0-99999999", "1024", "0-1024", ",".join(["0"] * 1025), "99999999999999999999"):
        with pytest.raises(UsageError, match="--gpus"):
            parse_gpu_list(text)
    assert time.monotonic() - t0 < 10  # `0-99999999` took 76 s
    assert parse_gpu_list("0-1023") == list(range(1024))
    assert parse_gpu_list("3,0-1,1") == [0, 1, 3]


def test_huge_gpu_list_is_exit_2_at_once(capsys):
    assert main(["run", "--gpus", "0-99999999", "--snapshot", str(SNAPS / "h100-healthy.json")]) == 2
    one_error_line(capsys, "--gpus", "1023")


# -- 4: one bad node never crashes the sweep ------------------------------------------------------

def healthy_verdict() -> dict:
    p = subprocess.run([sys.executable, "-m", "gpucheck", "run", "--json", "--no-history", "--snapshot",
                        str(SNAPS / "h100-healthy.json")], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def mutations(v: dict) -> dict[str, tuple[str, str]]:
    """{name: (node output, words the node's reason must hold)}: answers that are not verdicts."""
    def mutated(**changes) -> str:
        return json.dumps({**v, **changes})

    first = dict(v["results"][0])
    deep = "[" * 100_000 + "]" * 100_000
    return {
        "gpus-null": (mutated(gpus=None), "gpus is null"),
        "gpu-index-str": (mutated(gpus=[{**v["gpus"][0], "index": "0"}]), "gpus[0].index"),
        "results-not-list": (mutated(results={"a": 1}), "results is an object"),
        "result-not-object": (mutated(results=[1]), "results[0] is an integer"),
        "metrics-list": (mutated(results=[{**first, "metrics": []}]), "metrics is a list"),
        "metric-no-unit": (mutated(results=[{**first, "metrics": {"x": {"value": 1}}}]), "metrics.'x'"),
        "exit-code-str": (mutated(exit_code="0"), "exit_code '0'"),
        "exit-code-bool": (mutated(exit_code=False), "exit_code False"),
        "status-bad": (mutated(status="ok"), "status 'ok'"),
        "missing": (json.dumps({k: x for k, x in v.items() if k not in ("gpus", "results")}),
                    "missing gpus, results"),
        "fail-but-pass": (mutated(results=[{**first, "status": "fail"}]), "a result fails but the verdict says pass"),
        "error-exit-0": (mutated(results=[{**first, "status": "error"}]), "exit code 0 with an error result"),
        "deep": (deep, "nested too deep"),
        "deep-inside": (json.dumps(v)[:-1] + ', "x": ' + deep + "}", "nested too deep"),
        "version-nl": (mutated(schema_version="1.0\n"), "schema_version"),
    }


def test_verdict_checks_name_the_problem():
    v = healthy_verdict()
    assert verdict_problem(v) is None and parse_verdict(json.dumps(v))[0].to_json() == v
    newer = {**v, "schema_version": "1.7", "future_field": {"x": 1}}
    assert parse_verdict(json.dumps(newer))[0] is not None  # a later 1.x may add fields
    for name, (text, words) in mutations(v).items():
        verdict, why = parse_verdict(text)
        assert verdict is None and words in why, (name, why)
        o = classify(fanout.NodeRun("n1", 0, text))
        assert o.status == "error" and words in o.reason and o.inputs is None, (name, o.reason)


@pytest.mark.slow
def test_one_bad_node_never_crashes_the_sweep(tmp_path, fake_bin, capsys):
    v = healthy_verdict()
    answers = {name: text for name, (text, _) in mutations(v).items()}
    answers["good"] = json.dumps(v, indent=2)
    answers["huge"] = "x" * (fanout.MAX_OUTPUT_BYTES + 100_000)
    names = sorted(answers)
    for name, text in answers.items():
        (tmp_path / "answers" / f"{name}.out").write_text(text)
    report = tmp_path / "report.json"
    nodeset = ",".join(names)
    rc = main(["sweep", "--srun", nodeset, "--remote-cmd", "gpucheck-fake", "--timeout", "120s", "--fanout", "4",
               "--report", str(report)])
    out = capsys.readouterr().out
    assert rc == 1 and "bad nodes:" in out
    doc = json.loads(report.read_text())
    st = {n["node"]: n for n in doc["nodes"]}
    assert st["good"]["status"] == "pass" and st["good"]["verdict"] == v
    reasons = dict(mutations(v))
    for name in names:
        if name == "good":
            continue
        assert st[name]["status"] == "error" and st[name]["verdict"] is None, (name, st[name])
        want = "larger than" if name == "huge" else reasons[name][1]
        assert want in st[name]["reason"], (name, st[name]["reason"])
    assert doc["counts"]["pass"] == 1 and doc["counts"]["error"] == len(names) - 1


def test_fanout_keeps_a_bounded_output(monkeypatch):
    monkeypatch.setattr(fanout, "MAX_OUTPUT_BYTES", 10_000)
    monkeypatch.setattr(fanout, "MAX_STDERR_BYTES", 1_000)
    cmds = {"big": "yes 0123456789 | head -c 50000; yes e | head -c 5000 >&2; echo last >&2",
            "small": "echo ok"}
    runs = fanout.run_nodes(cmds, mode="exec", fanout=2, timeout_s=60)
    assert runs["big"].truncated and len(runs["big"].stdout) <= 10_000
    assert len(runs["big"].stderr) <= 1_000 and runs["big"].stderr.endswith("last")
    assert not runs["small"].truncated and runs["small"].stdout == "ok"
    o = classify(runs["big"])
    assert o.status == "error" and "larger than" in o.reason


def test_deep_json_from_a_rank_or_a_hang_node_is_garbage_not_a_crash():
    """A rank's event line or a node's hang document nested 100,000 deep: json raises
    RecursionError, which the parsers did not catch (only ValueError)."""
    from gpucheck.hang.collect import parse_node_doc
    from gpucheck.hang.pyspy import DumpError, parse_dump
    from gpucheck.nccl.report import parse_events

    deep = "[" * 100_000 + "]" * 100_000
    assert parse_events('{"event": "result", "x": ' + deep + "}\n") == []
    doc, why = parse_node_doc(deep)
    assert doc is None and why
    with pytest.raises(DumpError):
        parse_dump(deep, 1)
