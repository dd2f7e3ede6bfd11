"""One value of a port, as each format prints it, to the model's value: states, rates, counters."""

from __future__ import annotations

import re

from .model import PHYS_STATES, PORT_STATES, UNKNOWN, NetPort

_NUMBERED = re.compile(r"^\s*(\d+)\s*:\s*(.*?)\s*$")  # sysfs, ibstatus: "4: ACTIVE"
_PAREN = re.compile(r"^\s*([A-Za-z_<> -]+?)\s*\((\d+)\)\s*$")  # ibv_devinfo: "PORT_ACTIVE (4)"
_STATE_WORDS = {"down": "DOWN", "init": "INIT", "initializing": "INIT", "initialize": "INIT", "armed": "ARMED",
                "active": "ACTIVE", "activedefer": "ACTIVE_DEFER", "portdown": "DOWN", "portinit": "INIT",
                "portarmed": "ARMED", "portactive": "ACTIVE", "portactivedefer": "ACTIVE_DEFER"}
_PHYS_WORDS = {"sleep": "Sleep", "polling": "Polling", "disabled": "Disabled",
               "portconfigurationtraining": "PortConfigurationTraining", "linkup": "LinkUp",
               "linkerrorrecovery": "LinkErrorRecovery", "phytest": "PhyTest"}
_RATE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(?:Gb/sec|Gbps|Gb/s)?\s*(?:\((\d+X)\s*([A-Za-z0-9]*)\))?\s*$")
_WIDTH = re.compile(r"^\s*(\d+)X\b")
_SPEED = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*Gbps")
NOT_AVAILABLE = "N/A"  # node_exporter's i40iw: "N/A (no PMA)"


def _word(text: str) -> str:
    return re.sub(r"[\s_-]", "", text).lower()


def _numbered(text: str, table: dict[int, str], words: dict[str, str]) -> str:
    """A state printed with its number and/or its word: the name, or UNKNOWN when it does not
    parse or the number and the word disagree (procfs's "4: ACTIVE" as a physical state)."""
    m = _NUMBERED.match(text) or _PAREN.match(text)
    if m is None:
        return words.get(_word(text), UNKNOWN)
    num, word = (int(m.group(1)), m.group(2)) if m.re is _NUMBERED else (int(m.group(2)), m.group(1))
    by_number = table.get(num)
    by_word = words.get(_word(word))
    if by_number is None or (word.strip() and by_word != by_number):
        return UNKNOWN
    return by_number


def port_state(text: str) -> str:
    return _numbered(text, PORT_STATES, _STATE_WORDS)


def phys_state(text: str) -> str:
    return _numbered(text, PHYS_STATES, _PHYS_WORDS)


def set_states(p: NetPort, state: str | None, phys: str | None) -> None:
    """The port's logical and physical states from their texts (None: not in the source)."""
    if state is not None:
        p["state_text"], p["state"] = state.strip(), port_state(state)
        if p["state"] == UNKNOWN:
            p["problems"].append(f"state {state.strip()!r}")
    if phys is not None:
        p["phys_state_text"], p["phys_state"] = phys.strip(), phys_state(phys)
        if p["phys_state"] == UNKNOWN:
            p["problems"].append(f"phys_state {phys.strip()!r}")


def set_rate(p: NetPort, text: str) -> None:
    """"400 Gb/sec (4X NDR)" (sysfs, ibstatus), "400" (ibstat): rate, width and speed."""
    p["rate_text"] = text.strip()
    m = _RATE.match(text)
    if m is None:
        p["problems"].append(f"rate {text.strip()!r}")
        return
    p["rate_gbps"] = float(m.group(1))
    p["width"] = m.group(2)
    p["speed"] = m.group(3) or None


def set_width_speed(p: NetPort, width: str | None, speed: str | None) -> None:
    """ibv_devinfo -v: "4X (2)" and "50.0 Gbps (64)" -> rate 200 Gb/s ("invalid speed (0)": no rate)."""
    wm = _WIDTH.match(width or "")
    sm = _SPEED.match(speed or "")
    if wm:
        p["width"] = f"{wm.group(1)}X"
    if width is not None and speed is not None:
        p["rate_text"] = f"{width.strip()} x {speed.strip()}"
    if wm and sm:
        p["rate_gbps"] = round(int(wm.group(1)) * float(sm.group(1)), 3)
    elif speed is not None and not sm and "invalid" not in speed:
        p["problems"].append(f"active_speed {speed.strip()!r}")


def counter_value(text: str) -> int | None:
    """A counter file's content: its value, or None where the device does not provide it
    ("N/A (no PMA)"). Raises ValueError for anything else."""
    t = text.strip()
    if t.startswith(NOT_AVAILABLE):
        return None
    v = int(t, 0)
    if v < 0:
        raise ValueError(f"negative counter {t!r}")
    return v
