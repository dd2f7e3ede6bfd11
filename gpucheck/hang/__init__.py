"""`gpucheck hang`: which rank hung the job?

Dump every training process's Python stacks (py-spy, non-blocking) on every node of a job, group
the ranks by the signature of their main thread (and of the thread holding a collective), take
the dominant group as healthy and name the outlier ranks, their nodes and, given a topology, the
parallel groups to evict (ByteRobust's stack aggregation and over-eviction). PyTorch's flight
recorder dumps, where the job wrote them, add the collective sequence number where ranks diverge.

Modules:
  procs     find the job's rank processes in /proc (plain data in, plain data out for selection)
  pyspy     locate and run `py-spy dump --json`, parse its output
  flight    read flight-recorder dumps safely (no code runs from a pickle) and summarize them
  local     one node's collection: the `gpucheck.hang.node` document
  collect   the fan-out to many nodes, and validation of the documents they send back
  analysis  the pure analysis: normalization, grouping, suspects, flight-recorder divergence
  topology  Megatron rank order (tp/cp/dp/pp) or a groups file -> parallel groups, eviction
  slurmjob  a Slurm job's node list (scontrol)
"""
