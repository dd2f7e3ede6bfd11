"""The platform: what gpucheck reads from the machine and the operating system, judging nothing.

- `telemetry/`  NVML (the only module that calls it), snapshots, their replay, nvidia-smi captures
- `kernlog/`    the kernel log: sources (kmsg, journal, dmesg, files), parse, scan, follow, cursor
- host tools    `nodeset` (node sets), `fanout` (ssh/srun to many nodes), `placeholders`,
                `snippets` (remote shell pieces), `processes` (child processes, signals),
                `interrupts` (SIGTERM/SIGINT recorded), `safeio` (files that cannot hurt),
                `streams` (stdout that can fail), `argv`, `durations`, `pci`, `fingerprint`
                (software versions)

Nothing here imports the core, a check, an engine or the CLI.
"""
