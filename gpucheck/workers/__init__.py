"""Worker processes for compute checks: one spawned process per GPU, supervised by the parent.

`pool` is the reusable supervisor (`run_workers`), `sampler` the NVML sampling thread that runs
beside it, `per_gpu` one worker per GPU for a compute check (the check SDK's gpucheck.sdk.workers
gathers it for the checks), `results` the typed payloads the workers send, `targets` the GPUs a
check loads, `busy` the guard that never loads a GPU a job is using. Nothing here imports torch:
workers import it themselves, in their own process.
"""
