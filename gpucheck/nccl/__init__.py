"""Collective-communication engine: intra-node (driven by the check `nccl.intra`,
gpucheck/tests_suite/nccl_intra.py) and node pairs (`gpucheck nccl pairs`), with nccl-tests'
algbw/busbw and verification of every element.

Nothing here imports torch at module import; the rank processes do (gpucheck.nccl.collective).
"""
