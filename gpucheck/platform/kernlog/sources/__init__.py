"""Reading the kernel log: /dev/kmsg, journalctl -k, dmesg, log files, any file or stdin.

A reader returns plain data (`ReadResult`): the relevant lines with their prefixes (prefiltered
cheaply: only lines holding ``NVRM`` or ``SXid``, or a network event's needle, survive), the source that gave them, and every
source tried with why it failed. Nothing here parses events or judges anything.

Every path and command is injectable (`LogPaths`) so that the real readers run in tests on
temporary files, FIFOs and fake commands.

Failure is data, never silence: when nothing could be read, `ReadResult.ok` is False and
`ReadResult.error` says which sources were tried and why each failed (permission denied with the
kernel.dmesg_restrict hint, command not found, no entries, ...).

One module per seam: base (the result, the paths, boot time, permission hints), linefilter (the
NVRM/SXid/network prefilter), kmsg, command (running journalctl/dmesg), journal, dmesg, files, and
selection (which source, read_kernel_log).
"""
