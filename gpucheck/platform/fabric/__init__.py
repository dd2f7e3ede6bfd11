"""The node's fabric beyond the GPUs' own telemetry: PCIe AER (sysfs counters, lspci -vvv), the
NVSwitch fabric (Fabric Manager service and log, NVML's GPU fabric info). Readers only: plain
data out, never a judgement."""
