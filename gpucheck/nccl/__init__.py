"""Collective-communication tests: intra-node (check `nccl.intra`) and node pairs
(`gpucheck nccl pairs`), with nccl-tests' algbw/busbw and verification of every element.

Nothing here imports torch at module import; the rank processes do (gpucheck.nccl.collective).
"""
