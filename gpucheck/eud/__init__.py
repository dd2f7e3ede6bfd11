"""Extended utility diagnostics' engines: the layer an operator runs after a crash, before a GPU
goes back to work or out for RMA. The checks that drive them are in gpucheck/tests_suite/:

- eud.memtest   (eud_memtest.py)    HBM pattern test: `patterns`, `memtest_worker`, `memtest_cupy`
                                    (CuPy kernels; NumPy/torch on CPUs), `memtest_ecc` (ECC rules)
- eud.bandwidth (eud_bandwidth.py)  host<->device, device<->device and peer copy bandwidth: `copybw`
- eud.power     (eud_power.py)      power and clock stability under a sustained GEMM load:
                                    `power_judge`
- eud.dcgm      (eud_dcgm.py)       NVIDIA DCGM diagnostics (`dcgmi diag`) when installed:
                                    `dcgm_run`, `dcgm_parse`

Nothing here is imported by a level-1 run.
"""
