"""Reading the kernel log: /dev/kmsg, journalctl -k, dmesg, log files, any file or stdin.

A reader returns plain data (`ReadResult`): the relevant lines with their prefixes (prefiltered
cheaply: only lines holding ``NVRM`` or ``SXid`` survive), the source that gave them, and every
source tried with why it failed. Nothing here parses events or judges anything.

Every path and command is injectable (`LogPaths`) so that the real readers run in tests on
temporary files, FIFOs and fake commands.

Failure is data, never silence: when nothing could be read, `ReadResult.ok` is False and
`ReadResult.error` says which sources were tried and why each failed (permission denied with the
kernel.dmesg_restrict hint, command not found, no entries, ...).

One module per seam: base (the result, the paths, boot time, permission hints), linefilter (the
NVRM/SXid prefilter), kmsg, command (running journalctl/dmesg), journal, dmesg, files, and
selection (which source, read_kernel_log). Their names are importable from here.
"""

from .base import (  # noqa: F401
    DEFAULT_PATHS, DEFAULT_TIMEOUT_S, Attempt, Chunk, LogPaths, ReadResult, oserror_text, permission_hint,
    read_boot_time,
)
from .command import run_command  # noqa: F401
from .dating import boot_clock_stamps, not_this_boot  # noqa: F401
from .files import open_log_file, read_file, read_stream, rotated_files  # noqa: F401
from .kmsg import KMSG_READ_BYTES, KmsgRead, read_kmsg  # noqa: F401
from .linefilter import CHUNK_BYTES, MAX_LINE_BYTES, NEEDLES, Counter, iter_relevant_lines  # noqa: F401
from .selection import SOURCES, read_kernel_log  # noqa: F401
