"""`hang --from` and `hang --groups` read what a user names through gpucheck.platform.safeio: regular files
only (a FIFO is refused, never waited on; a device is refused, never read without end), a size
limit, JSON nested at most safeio.MAX_JSON_DEPTH deep. Each refusal is a usage error naming the
file (exit 2)."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest
from capped_run import private_device, run_gpucheck

from gpucheck.cli.main import main
from gpucheck.hang.topology import TopologyError, load_groups

ROOT = Path(__file__).resolve().parents[1]
HANG_DOC = ROOT / "tests" / "fixtures" / "hang" / "node-4ranks-rank2-hung.json"


def test_hang_groups_from_a_zero_device_is_refused(tmp_path):
    zero = private_device(tmp_path, "groups.json", 1, 5)  # our own /dev/zero
    rc, err = run_gpucheck(["hang", "--from", str(HANG_DOC), "--groups", str(zero)], seconds=30,
                           memory_bytes=768 << 20)
    assert rc == 2 and "groups.json" in err and "character device" in err, err[-400:]


def test_groups_read_through_a_symlink_to_a_fifo_are_refused(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    link = tmp_path / "groups.json"
    link.symlink_to(fifo)
    box: dict[str, BaseException] = {}

    def load() -> None:
        try:
            load_groups(str(link))
        except BaseException as e:
            box["error"] = e

    reader = threading.Thread(target=load, daemon=True)
    reader.start()
    reader.join(10)
    hung = reader.is_alive()
    if hung:  # release the reader blocked in open(): a writer comes and goes (end-of-file)
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        reader.join(5)
    assert not hung, "load_groups waited for a writer on a FIFO"
    assert isinstance(box.get("error"), TopologyError) and "not a regular file" in str(box["error"])


@pytest.mark.parametrize("option", ["--from", "--groups"])
def test_a_file_that_is_not_utf8_is_a_usage_error_naming_it(tmp_path, capsys, option):
    bad = tmp_path / "latin1.json"
    bad.write_bytes(b'{"tp": [[0, 1]], "note": "\xe9"}')
    argv = ["hang", "--from", str(bad)] if option == "--from" else ["hang", "--from", str(HANG_DOC), "--groups", str(bad)]
    rc = main(argv)
    err = capsys.readouterr().err
    assert rc == 2 and f"{bad}: not UTF-8 text" in err and option in err


def test_groups_still_load_from_a_regular_file(tmp_path, capsys):
    groups = tmp_path / "groups.json"
    groups.write_text('{"tp": [[0, 1], [2, 3]]}')
    rc = main(["hang", "--from", str(HANG_DOC), "--groups", str(groups), "--json"])
    assert rc == 1  # rank 2 hung: a suspect, with its TP group
    assert '"tp"' in capsys.readouterr().out
