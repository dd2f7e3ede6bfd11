"""Extended utility diagnostics: the layer an operator runs after a crash, before a GPU goes back
to work or out for RMA.

- `gpucheck.eud.memtest`   eud.memtest   HBM pattern test (CuPy kernels; NumPy/torch on CPUs)
- `gpucheck.eud.bandwidth` eud.bandwidth host<->device, device<->device and peer copy bandwidth
- `gpucheck.eud.power`     eud.power     power and clock stability under a sustained GEMM load
- `gpucheck.eud.dcgm`      eud.dcgm      NVIDIA DCGM diagnostics (`dcgmi diag`) when installed

Each module's `CHECKS` is listed in gpucheck.registry; nothing here is imported by a level-1 run.
"""
