"""gpucheck: node-health and stress diagnostics for GPU training clusters."""

__version__ = "0.1.0"
