"""Where the sysfs reader reads from: the live /sys (under a root prefix), or a recording of the
files it read (a snapshot's `net.raw`, a gcm node dump), so that a replay goes through the same
reader. Paths are relative to the sysfs root ("class/infiniband/mlx5_0/ports/1/state")."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Protocol

from ..pci import normalize_bus_id


class Unreadable(Exception):
    """A file or folder that exists but could not be read (permission, I/O error)."""


class Tree(Protocol):
    def listdir(self, rel: str) -> list[str] | None:
        """The names in folder `rel`, sorted; None when it does not exist. Raises Unreadable."""

    def read(self, rel: str) -> str | None:
        """The text of file `rel`; None when it does not exist. Raises Unreadable."""

    def pci_chain(self, rel: str) -> list[str] | None:
        """The PCI functions from the root port down to the device that folder `rel` belongs to
        (its resolved path), or None where not known."""


def _chain_of(resolved: str) -> list[str] | None:
    chain = [b for b in (normalize_bus_id(part) for part in resolved.split("/")) if b]
    return chain or None


class DirTree:
    """The files under a sysfs root (live /sys, or a copied tree)."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)

    def listdir(self, rel: str) -> list[str] | None:
        try:
            return sorted(os.listdir(self.root / rel))
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as e:
            raise Unreadable(f"{self.root / rel}: {e.strerror or e}") from e

    def read(self, rel: str) -> str | None:
        try:
            with open(self.root / rel, "rb") as f:
                return f.read(1 << 16).decode("utf-8", "replace")
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as e:
            raise Unreadable(f"{self.root / rel}: {e.strerror or e}") from e

    def pci_chain(self, rel: str) -> list[str] | None:
        try:
            return _chain_of(os.path.realpath(self.root / rel))
        except OSError:
            return None


class RecordingTree:
    """A tree that keeps what it read, for the snapshot's `net.raw` (replayed by MapTree)."""

    def __init__(self, inner: Tree) -> None:
        self.inner = inner
        self.files: dict[str, str | None] = {}
        self.dirs: dict[str, list[str] | None] = {}
        self.chains: dict[str, list[str] | None] = {}

    def listdir(self, rel: str) -> list[str] | None:
        self.dirs[rel] = self.inner.listdir(rel)
        return self.dirs[rel]

    def read(self, rel: str) -> str | None:
        self.files[rel] = self.inner.read(rel)
        return self.files[rel]

    def pci_chain(self, rel: str) -> list[str] | None:
        self.chains[rel] = self.inner.pci_chain(rel)
        return self.chains[rel]

    def recording(self) -> dict[str, object]:
        return {"kind": "sysfs", "dirs": self.dirs, "files": self.files, "chains": self.chains}


class MapTree:
    """A recorded tree: {"files": {rel: text|null}, "dirs": {rel: [names]|null}, "chains": {rel: [bus ids]}}.
    Folders not listed in `dirs` are inferred from the file paths (a gcm node dump)."""

    def __init__(self, files: dict[str, str | None], dirs: dict[str, list[str] | None] | None = None,
                 chains: dict[str, list[str] | None] | None = None) -> None:
        self.files = files
        self.dirs = dict(dirs or {})
        self.chains = dict(chains or {})
        if dirs is None:
            for path in files:
                parts = path.split("/")
                for i in range(len(parts)):
                    names = self.dirs.setdefault("/".join(parts[:i]), [])
                    if names is not None and parts[i] not in names:
                        names.append(parts[i])
            self.dirs = {k: sorted(v) if v is not None else None for k, v in self.dirs.items()}

    def listdir(self, rel: str) -> list[str] | None:
        return self.dirs.get(rel)

    def read(self, rel: str) -> str | None:
        return self.files.get(rel)

    def pci_chain(self, rel: str) -> list[str] | None:
        return self.chains.get(rel)
