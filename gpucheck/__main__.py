"""`python -m gpucheck ...`"""

from .cli.main import entry

entry()
