"""Verifiable collective inputs and the check of every rank's output, on the tensor's device.

Every element a rank contributes is a small integer stored as float32:

    p(rank, i, iteration) = ((7*i + 131*(rank+1) + 17*iteration) mod 251) - 125

so any sum over ranks stays far below 2**24 and is exactly representable whatever order the
reduction runs in: the expected result is known bit for bit. The rank term makes a dropped or
duplicated contribution visible, the iteration term makes stale data from the previous iteration
visible, and the index term makes shifted or swapped chunks visible.

torch is passed in (imported lazily by the caller, inside the rank process).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

MOD = 251
HALF = 125
_I_MUL = 7
_R_MUL = 131
_K_MUL = 17


def offset(rank: int, iteration: int) -> int:
    return (_R_MUL * (rank + 1) + _K_MUL * iteration) % MOD


def value(rank: int, index: int, iteration: int) -> int:
    """The pattern element as a plain integer (used by unit tests and for messages)."""
    return ((_I_MUL * index + offset(rank, iteration)) % MOD) - HALF


@dataclass
class Check:
    bad: int  # number of wrong elements
    index: int | None = None  # first wrong element of the output
    expected: float | None = None
    got: float | None = None
    src_rank: int | None = None  # the rank whose chunk holds the first wrong element (gather, a2a)


class Patterns:
    """Buffers, inputs and expected outputs of one collective at one size on one rank.

    `slots` input/output buffer sets let a batch of iterations run back to back (as a bare loop
    would, with the ranks in lockstep) and be verified afterwards: slot j holds the data of the
    iteration it was last prepared for. The expected output is computed at verification time
    into one shared buffer.
    """

    def __init__(self, torch: Any, op: str, size_bytes: int, rank: int, world: int, device: Any,
                 slots: int = 1):
        self.torch = torch
        self.op = op
        self.rank = rank
        self.world = world
        self.device = device
        n = size_bytes // 4
        if n % world:
            raise ValueError(f"size {size_bytes} B is not a whole number of float32 chunks for {world} ranks")
        if op not in ("all_reduce", "all_gather", "all_to_all"):
            raise ValueError(f"no pattern for collective {op!r}")
        self.numel = n
        self.chunk = n // world
        # 7*i mod 251 for every output position, kept small (int16) and computed once.
        ar = torch.arange(n, device=device, dtype=torch.int64)
        self._base = ((ar % MOD) * _I_MUL % MOD).to(torch.int16)
        del ar
        in_n = self.chunk if op == "all_gather" else n

        def buf(k: int) -> Any:
            return torch.empty(k, dtype=torch.float32, device=device)

        self.inputs = [buf(in_n) for _ in range(slots)]
        # all_reduce runs in place, as torch's all_reduce does
        self.outputs = self.inputs if op == "all_reduce" else [buf(n) for _ in range(slots)]
        self.iteration = [-1] * slots
        self.expected = buf(n)
        self._part = buf(n) if op == "all_reduce" else None
        self._scratch = torch.empty(n, dtype=torch.int16, device=device)

    @property
    def inp(self) -> Any:
        return self.inputs[0]

    @property
    def out(self) -> Any:
        return self.outputs[0]

    def _pattern(self, base: Any, rank: int, iteration: int, out: Any) -> Any:
        """out <- p(rank, i, iteration) for the positions whose 7*i mod 251 is `base`."""
        torch = self.torch
        s = self._scratch[: base.numel()]
        torch.add(base, offset(rank, iteration), out=s)
        torch.remainder(s, MOD, out=s)
        out.copy_(s)
        out.sub_(HALF)
        return out

    def prepare(self, iteration: int, slot: int = 0) -> None:
        """Fill this rank's input of `slot` for `iteration` (outside the timing)."""
        c = self.chunk
        base = self._base[:c] if self.op == "all_gather" else self._base
        self._pattern(base, self.rank, iteration, self.inputs[slot])
        if self.op != "all_reduce":
            self.outputs[slot].fill_(float("nan"))
        self.iteration[slot] = iteration

    def _expect(self, iteration: int) -> Any:
        c, r, exp = self.chunk, self.rank, self.expected
        if self.op == "all_reduce":
            exp.zero_()
            for q in range(self.world):
                exp.add_(self._pattern(self._base, q, iteration, self._part))
        elif self.op == "all_gather":
            for q in range(self.world):
                self._pattern(self._base[:c], q, iteration, exp[q * c:(q + 1) * c])
        else:  # all_to_all: chunk q of my output is chunk r of rank q's input
            for q in range(self.world):
                self._pattern(self._base[r * c:(r + 1) * c], q, iteration, exp[q * c:(q + 1) * c])
        return exp

    def verify(self, slot: int = 0) -> Check:
        """Compare the output of `slot` with the expected result of the iteration it ran."""
        torch = self.torch
        out = self.outputs[slot]
        exp = self._expect(self.iteration[slot])
        wrong = out.ne(exp)
        nbad = int(wrong.sum().item())
        if not nbad:
            return Check(0)
        idx = int(torch.argmax(wrong.to(torch.uint8)).item())
        src = None if self.op == "all_reduce" else idx // self.chunk
        return Check(nbad, idx, float(exp[idx].item()), float(out[idx].item()), src)

    def corrupt(self, index: int, slot: int = 0) -> int:
        """Fault injection: change one element of this rank's output. Returns the index used."""
        i = int(index) % self.numel
        self.outputs[slot].view(-1)[i] += 1.0
        return i
