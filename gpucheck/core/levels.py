"""The levels of a run, 1 quick ... 4 burn-in: every check declares the lowest level it runs at,
and a run at level N runs the selected checks of levels <= N."""

from __future__ import annotations

import enum


class Level(enum.IntEnum):
    QUICK = 1
    STANDARD = 2
    EXTENDED = 3
    BURN_IN = 4

    @property
    def label(self) -> str:
        return self.name.lower().replace("_", "-")

    @classmethod
    def parse(cls, text: str | int) -> "Level":
        s = str(text).strip().lower()
        if s.isdigit() and int(s) in {lv.value for lv in cls}:
            return cls(int(s))
        for lv in cls:
            if s == lv.label or s == lv.name.lower():
                return lv
        raise ValueError(
            f"unknown level {text!r}: use 1-4 or one of "
            + ", ".join(lv.label for lv in cls)
        )
