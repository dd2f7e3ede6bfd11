"""Fleet operations: many nodes at once.

nodeset  Slurm/ClusterShell node-set syntax (`gpu[001-128,130],login1`): parse (names checked,
         size bounded), fold
placeholders  `{host}`/`{nodes}` substituted shell-quoted; refused inside quoted strings
fanout   run one command per node over ssh (ClusterShell) or srun, bounded fan-out, per-node timeout
snippets a node's output in one line (sweep and hang quote it)
remote   what a sweep runs on the nodes and how (the remote options -> a SweepPlan)
sweep    turn each node's output into a node status (pass/warn/fail/error/unreachable/timeout);
         a whole sweep: run, stop on a signal, compare, report
compare  compare nodes with each other: bitwise digests by majority, throughput outliers (MAD)
slurm    the job's environment, scontrol (node states, drain), syslog, and `slurm resume`
hook     the Slurm prolog/epilog hooks and how they read their options
bisect   find the bad node(s) of a failing job's node list with group tests

Nothing here is imported by the core; the CLI (gpucheck.cli.sweep, .slurm, .bisect) imports it on
demand.
"""
