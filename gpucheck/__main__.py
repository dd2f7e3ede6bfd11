"""`python -m gpucheck ...`"""

from .cli.start import entry

entry()
