"""gpucheck's CuPy code and the CPU suite's stand-in (tests/fakecupy.py) against the real CuPy.

The GPU half of gpucheck runs on the CPU against a stub `cupy`; these tests keep both honest
without a GPU, against the installed cupy-cuda13x wheel (it imports without one):

(a) every `cupy.…` attribute chain gpucheck uses (gpucheck/, benchmarks/, scripts/), found by
    AST (tests/cupy_uses.py), resolves on the real module;
(b) every member gpucheck uses on the objects CuPy gives it exists on the real class, every call
    fits the real signature, every exception it catches is one, every device-property key it
    reads is one CuPy sets; where the kind of a value needs a table (RETURNS, METHODS, MEMBERS,
    PARAMS below), a use the tables do not cover fails the test;
(c) the stub's modules hold only names the real ones have, and each of its classes (mapped to
    its real counterpart in FAKE_TO_REAL; a class in neither FAKE_TO_REAL nor TEST_SIDE fails)
    has no public member the real class lacks, the same kind of member (method or attribute),
    constructors and methods whose parameters fit the real ones, and private state under names
    the real class does not use.

With (c), a member gpucheck uses that the real class lacks cannot pass the fake-CuPy tests
either (the stub raises AttributeError), for every path those tests run; (b) covers the paths
they do not (error handlers, benchmarks).

The real API, CuPy 14.2.0 (cupy/_core/raw.pyx, cupy/cuda/function.pyx): RawModule.get_function
returns a RawKernel, whose `kernel` property is the cupy.cuda.function.Function holding the
CUfunction handle as `ptr`; a RawKernel has no `ptr`.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import os
import re
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest

if os.environ.get("GPUCHECK_NO_SKIP"):  # CI installed it (.ci/run): its absence fails, never skips
    import cupy
else:
    cupy = pytest.importorskip("cupy")  # a test dependency (pyproject.toml [test])

import cudaemu  # noqa: E402
import cupy_uses  # noqa: E402
import fakecupy  # noqa: E402
from cupy_uses import Use, class_path  # noqa: E402
from gpucheck.kernels import source  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
FAKE_SOURCE = Path(fakecupy.__file__)
CUPY_VERSION = "14.2.0"  # the wheel gpucheck pins for its GPU machines (pyproject.toml, .ci/run)

# What CuPy's functions return where gpucheck uses the result as an object ("inst": an instance
# of that class; "props": getDeviceProperties' dict); an empty set: plain data (ints, tuples).
# From CuPy 14.2's docstrings and source (cupy/cuda/stream.pyx, cupy_backends/cuda/api/runtime.pyx).
RETURNS = {
    "cupy.cuda.get_current_stream": {("inst", "cupy.cuda.stream._BaseStream")},
    "cupy.cuda.get_elapsed_time": set(),
    "cupy.cuda.runtime.getDeviceProperties": {("props",)},
    "cupy.cuda.runtime.getDeviceCount": set(),
    "cupy.cuda.runtime.getDevice": set(),
    "cupy.cuda.runtime.memGetInfo": set(),
    "cupy.cuda.runtime.runtimeGetVersion": set(),
    "cupy.cuda.runtime.memcpyAsync": set(),
    "cupy.cuda.driver.occupancyMaxActiveBlocksPerMultiprocessor": set(),
}
# What methods return (cupy/_core/raw.pyx: get_function returns a RawKernel).
METHODS = {
    ("cupy.RawModule", "get_function"): {("inst", "cupy.RawKernel")},
    ("cupy.RawModule", "compile"): set(),
    ("cupy.RawKernel", "__call__"): set(),
    ("cupy.ndarray", "get"): set(),
    ("cupy.ndarray", "set"): set(),
    ("cupy.ndarray", "__getitem__"): {("inst", "cupy.ndarray")},
    ("cupy.cuda.Event", "record"): set(),
    ("cupy.cuda.Event", "synchronize"): set(),
    ("cupy.cuda.stream._BaseStream", "synchronize"): set(),
    ("cupy.cuda.Device", "use"): set(),
}
# What members are (raw.pyx: RawKernel.kernel is a cupy.cuda.function.Function; core.pyx:
# ndarray.data is a MemoryPointer).
MEMBERS = {
    ("cupy.RawKernel", "kernel"): {("inst", "cupy.cuda.function.Function")},
    ("cupy.cuda.function.Function", "ptr"): set(),
    ("cupy.ndarray", "data"): {("inst", "cupy.cuda.MemoryPointer")},
    ("cupy.ndarray", "size"): set(),
    ("cupy.ndarray", "nbytes"): set(),
    ("cupy.ndarray", "shape"): set(),
    ("cupy.ndarray", "dtype"): set(),
    ("cupy.cuda.MemoryPointer", "ptr"): set(),
    ("cupy.cuda.Memory", "ptr"): set(),
    ("cupy.cuda.stream._BaseStream", "ptr"): set(),
    ("cupy.cuda.Event", "done"): set(),
    ("cupy.cuda.Device", "compute_capability"): set(),
}
NDARRAY = {("inst", "cupy.ndarray")}
EVENT = {("inst", "cupy.cuda.Event")}
STREAM = {("inst", "cupy.cuda.stream._BaseStream")}
NOT_CUPY: set = set()  # a parameter gpucheck uses that is no CuPy object
MEMTEST = "gpucheck/eud/memtest_cupy.py"
# What gpucheck's parameters are, in the functions that touch CuPy (file, function, parameter).
PARAMS = {
    ("gpucheck/kernels/cupy_module.py", "launch", "stream"): STREAM,
    (MEMTEST, "CupyBackend.__init__", "numpy"): NOT_CUPY,
    (MEMTEST, "CupyBackend.__init__", "cfg"): NOT_CUPY,
    (MEMTEST, "CupyBackend.create", "chan"): NOT_CUPY,
    (MEMTEST, "CupyBackend.address", "buf"): NDARRAY,
    (MEMTEST, "CupyBackend.release", "bufs"): NOT_CUPY,  # a list of ndarrays
    (MEMTEST, "CupyBackend.fill", "buf"): NDARRAY,
    (MEMTEST, "CupyBackend.check", "buf"): NDARRAY,
    (MEMTEST, "CupyBackend.elapsed", "t0"): EVENT,
    (MEMTEST, "CupyBackend.wait", "ev"): EVENT,
    (MEMTEST, "CupyBackend.copy", "dst"): NDARRAY,
    (MEMTEST, "CupyBackend.copy", "src"): NDARRAY,
    ("gpucheck/poet/cupy_ops.py", "CupyOps.__init__", "torch"): NOT_CUPY,
    ("gpucheck/poet/cupy_ops.py", "CupyOps.__init__", "dev"): NOT_CUPY,
    ("gpucheck/poet/cupy_ops.py", "CupyOps._run", "args"): NOT_CUPY,  # (kind, torch tensor) pairs
    ("benchmarks/bench_poet.py", "_machine", "torch"): NOT_CUPY,
    ("benchmarks/bench_poet.py", "_machine", "dev"): NOT_CUPY,
}
# getDeviceProperties' keys in a CUDA build of CuPy 14.2 (cupy_backends/cuda/api/runtime.pyx,
# the dict every CUDA build returns); checked against the installed extension's strings below.
DEVICE_PROPERTY_KEYS = frozenset({
    "name", "totalGlobalMem", "sharedMemPerBlock", "regsPerBlock", "warpSize", "maxThreadsPerBlock",
    "maxThreadsDim", "maxGridSize", "clockRate", "totalConstMem", "major", "minor", "textureAlignment",
    "texturePitchAlignment", "multiProcessorCount", "kernelExecTimeoutEnabled", "integrated", "canMapHostMemory",
    "computeMode", "maxTexture1D", "maxTexture2D", "maxTexture3D", "concurrentKernels", "ECCEnabled", "pciBusID",
    "pciDeviceID", "pciDomainID", "tccDriver", "memoryClockRate", "memoryBusWidth", "l2CacheSize",
    "maxThreadsPerMultiProcessor", "isMultiGpuBoard", "cooperativeLaunch", "cooperativeMultiDeviceLaunch"})

# Each class of tests/fakecupy.py: the real class it stands for, or (TEST_SIDE) why it stands for none.
FAKE_TO_REAL = {
    "FakeCupyModule": "cupy",  # the stub module itself
    "CUDARuntimeError": "cupy.cuda.runtime.CUDARuntimeError",
    "CUDADriverError": "cupy.cuda.driver.CUDADriverError",
    "Memory": "cupy.cuda.memory.Memory",
    "MemoryPointer": "cupy.cuda.memory.MemoryPointer",
    "ndarray": "cupy.ndarray",
    "_BaseStream": "cupy.cuda.stream._BaseStream",
    "Stream": "cupy.cuda.stream.Stream",
    "ExternalStream": "cupy.cuda.stream.ExternalStream",
    "Event": "cupy.cuda.stream.Event",
    "Device": "cupy.cuda.device.Device",
    "Function": "cupy.cuda.function.Function",
    "RawKernel": "cupy.RawKernel",
    "RawModule": "cupy.RawModule",
}
TEST_SIDE = {
    "FakeCupy": "the test's handle and the device state; never in sys.modules",
    "Launch": "a launch as the test reads it back",
    "Ptr": "a pointer argument as a launch record keeps it",
    "LaunchArgumentError": "a test failure (AssertionError): a launch CuPy would pass with other types",
}
# Python's own dunders of any class: not API a fake could add.
PYTHON_DUNDERS = {"__init__", "__del__", "__dict__", "__weakref__", "__module__", "__qualname__", "__doc__",
                  "__annotations__", "__firstlineno__", "__static_attributes__", "__slotnames__"}
MODULE_DUNDERS = {"__name__", "__doc__", "__package__", "__loader__", "__spec__"}


# -- the real CuPy ------------------------------------------------------------------------------------
def resolve(path: str) -> Any:
    """The real object at `path`: an attribute chain from `cupy` (as gpucheck's code reaches it),
    or from the longest importable module prefix for other packages."""
    parts = path.split(".")
    if parts[0] == "cupy":
        obj: Any = cupy
        for p in parts[1:]:
            obj = getattr(obj, p)
        return obj
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for p in parts[i:]:
            obj = getattr(obj, p)
        return obj
    raise ImportError(path)


def documented_attributes(cls: type) -> set[str]:
    """Instance attributes of a Python-level CuPy class, as its docstrings' `Attributes:` sections
    name them (`~Event.ptr (intptr_t): ...`): they are set in __init__, not visible on the class."""
    out = set()
    for c in cls.__mro__:
        doc = c.__dict__.get("__doc__") or ""
        if "Attributes:" in doc:
            out |= set(re.findall(r"~\w+\.(\w+) \(", doc.split("Attributes:", 1)[1]))
    return out


def real_members(cls: type) -> set[str]:
    return set(dir(cls)) | documented_attributes(cls)


def real_instances() -> dict[str, Any]:
    """Real instances that need no GPU (the null stream is made at import)."""
    stream = sys.modules["cupy.cuda.stream"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # ExternalStream: deprecated in CuPy 14
        return {"cupy.cuda.stream.Stream": cupy.cuda.Stream.null, "cupy.cuda.stream._BaseStream": stream._BaseStream(1, 0),
                "cupy.cuda.stream.ExternalStream": cupy.cuda.ExternalStream(1, 0)}


def tables() -> cupy_uses.Tables:
    def canon(kinds: set) -> frozenset:
        return frozenset(("inst", class_path(resolve(k[1]))) if k[0] == "inst" else k for k in kinds)

    return cupy_uses.Tables(
        returns={p: canon(v) for p, v in RETURNS.items()},
        methods={(class_path(resolve(c)), m): canon(v) for (c, m), v in METHODS.items()},
        members={(class_path(resolve(c)), m): canon(v) for (c, m), v in MEMBERS.items()},
        params={k: canon(v) for k, v in PARAMS.items()})


def scanned_files() -> list[Path]:
    return sorted(p for d in ("gpucheck", "benchmarks", "scripts") for p in (ROOT / d).rglob("*.py"))


@pytest.fixture(scope="module")
def uses() -> set[Use]:
    return cupy_uses.scan(scanned_files(), ROOT, resolve, tables())


def _of(uses: set[Use], what: str) -> list[Use]:
    return sorted((u for u in uses if u.what == what), key=lambda u: (u.where, u.target))


def _split_member(target: str) -> tuple[str, str]:
    cls, _, member = target.rpartition(".")
    return cls, member


# -- signatures --------------------------------------------------------------------------------------
SIG_LINE = re.compile(r"^(?:[\w.]*\.)?(\w+)\((.*)\)\s*(?:->.*)?$")


def _split_params(text: str) -> list[str]:
    out, depth, cur = [], 0, ""
    for ch in text:
        depth += ch in "([{"
        depth -= ch in ")]}"
        if ch == "," and depth == 0:
            out.append(cur.strip())
            cur = ""
        else:
            cur += ch
    return out + ([cur.strip()] if cur.strip() else [])


def docstring_signature(obj: Any) -> list[tuple[str, str, bool]] | None:
    """(name, kind, has default) of the parameters in the first line of `obj`'s docstring when it
    is a signature (Cython's embedsignature: `occupancyMaxActiveBlocksPerMultiprocessor(intptr_t
    func, int blockSize, size_t dynamicSMemSize) -> int`), without self. Kinds: "any" (positional
    or keyword: Cython's class docstrings do not say keyword-only reliably), "kwonly" after a
    bare `*`, "varargs", "varkw"."""
    doc = (getattr(obj, "__doc__", None) or "").strip().splitlines()
    m = SIG_LINE.match(doc[0].strip()) if doc else None
    if not m:
        return None
    out, kind = [], "any"
    for p in _split_params(m.group(2)):
        if p == "*":
            kind = "kwonly"
        elif p.startswith("**"):
            out.append((p[2:], "varkw", False))
        elif p.startswith("*"):
            out.append((p[1:], "varargs", False))
            kind = "kwonly"
        else:
            name = p.split("=", 1)[0].split()[-1]
            if name != "self":
                out.append((name, kind, "=" in p))
    return out


def inspect_signature(obj: Any) -> list[tuple[str, str, bool]] | None:
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        return None
    kinds = {inspect.Parameter.POSITIONAL_ONLY: "any", inspect.Parameter.POSITIONAL_OR_KEYWORD: "any",
             inspect.Parameter.KEYWORD_ONLY: "kwonly", inspect.Parameter.VAR_POSITIONAL: "varargs",
             inspect.Parameter.VAR_KEYWORD: "varkw"}
    return [(p.name, kinds[p.kind], p.default is not inspect.Parameter.empty)
            for p in sig.parameters.values() if p.name != "self"]


def real_signature(obj: Any) -> list[tuple[str, str, bool]] | None:
    """The parameters of a real callable as far as the wheel exposes them (None: not at all). For
    a class: its docstring's first line when that is a signature (Cython classes), else
    inspect's (Python classes), unless that is only (*args, **kwargs)."""
    sig = docstring_signature(obj)
    if sig is None and isinstance(obj, type):
        lines = [ln.strip() for ln in (obj.__doc__ or "").splitlines() if ln.strip()]
        if lines and lines[0].startswith("__init__("):  # ndarray: "__init__(shape, dtype=float, ...)"
            sig = docstring_signature(type("Doc", (), {"__doc__": lines[0]}))
    if sig is None:
        sig = inspect_signature(obj)
    if sig and {k for _, k, _ in sig} <= {"varargs", "varkw"}:  # (*args, **kwargs): says nothing
        return None
    return sig


def call_misfit(sig: list[tuple[str, str, bool]], npos: int, keywords: tuple, star: bool) -> str | None:
    """Why a call with `npos` positional arguments and `keywords` does not fit `sig` (None: it does)."""
    named = [(n, k, d) for n, k, d in sig if k in ("any", "kwonly")]
    positional = [n for n, k, _ in named if k == "any"]
    if npos > len(positional) and not any(k == "varargs" for _, k, _ in sig):
        return f"{npos} positional arguments, the real one takes {len(positional)}"
    unknown = [kw for kw in keywords if kw not in {n for n, _, _ in named}]
    if unknown and not any(k == "varkw" for _, k, _ in sig):
        return f"no parameter {', '.join(unknown)}"
    missing = [n for n, _, d in named if not d and n not in positional[:npos] and n not in keywords]
    if missing and not star:
        return f"missing {', '.join(missing)}"
    return None


def signature_misfit(fake: list[tuple[str, str, bool]], real: list[tuple[str, str, bool]]) -> str | None:
    """Why the fake's parameters do not model the real ones: each fake parameter must be a real one
    (positional ones at the same place), required exactly where the real one is, and every real
    required parameter must be there. The fake may leave out optional ones."""
    real_named = [(n, k, d) for n, k, d in real if k in ("any", "kwonly")]
    real_pos = [n for n, _, _ in real_named]
    real_by_name = {n: (k, d) for n, k, d in real_named}
    fake_pos = [n for n, k, _ in fake if k == "any"]
    for n, k, d in fake:
        if k in ("varargs", "varkw"):
            if not any(rk == k for _, rk, _ in real):
                return f"*{n}: the real one has no {k}"
            continue
        if n not in real_by_name:
            return f"parameter {n!r}: the real one has none"
        if k == "any" and real_pos.index(n) != fake_pos.index(n):
            return f"parameter {n!r} at position {fake_pos.index(n)}, the real one at {real_pos.index(n)}"
        if d != real_by_name[n][1]:
            return f"parameter {n!r} is {'optional' if d else 'required'} here, not in the real one"
    have = {n for n, _, _ in fake}
    missing = [n for n, _, d in real_named if not d and n not in have]
    return f"missing required {', '.join(missing)}" if missing else None


# -- (a) the chains -------------------------------------------------------------------------------------
@pytest.mark.slow
def test_the_scan_finds_gpuchecks_cupy_code(uses):
    """The scan reads the CuPy-using modules (a scan that found nothing would pass everything)."""
    files = {u.where.split(":")[0] for u in uses}
    assert {"gpucheck/kernels/cupy_module.py", "gpucheck/eud/memtest_cupy.py", "gpucheck/poet/cupy_ops.py",
            "gpucheck/poet/worker.py", "benchmarks/bench_poet.py"} <= files
    assert {"cupy.RawModule", "cupy.cuda.driver.occupancyMaxActiveBlocksPerMultiprocessor",
            "cupy.cuda.runtime.getDeviceProperties", "cupy.cuda.Memory", "cupy.cuda.Stream.null"} <= \
        {u.target for u in _of(uses, "path")}


@pytest.mark.slow
def test_every_cupy_chain_gpucheck_uses_resolves_on_the_real_module(uses):
    bad = []
    for u in _of(uses, "path"):
        try:
            resolve(u.target)
        except (AttributeError, ImportError) as e:
            bad.append(f"{u.where}: {u.target} ({e})")
    assert not bad, "CuPy names gpucheck uses that the real CuPy lacks:\n" + "\n".join(bad)


# -- (b) the members, calls, exceptions and keys -----------------------------------------------------------
@pytest.mark.slow
def test_every_member_gpucheck_uses_on_a_cupy_object_exists_on_the_real_class(uses):
    bad = []
    for u in _of(uses, "member"):
        cls, member = _split_member(u.target)
        if member not in real_members(resolve(cls)):
            bad.append(f"{u.where}: {u.target}")
    assert not bad, "members the real CuPy classes lack:\n" + "\n".join(bad)


@pytest.mark.slow
def test_every_value_gpucheck_uses_as_an_object_has_a_known_kind(uses):
    """A member or return value the tables do not describe, used further, and a parameter that
    PARAMS does not account for, in code that touches CuPy: extend the tables (from CuPy's source)."""
    bad = [f"{u.where}: {u.what} {u.target}" for u in _of(uses, "unknown") + _of(uses, "param")]
    assert not bad, "uses the conformance tables do not cover:\n" + "\n".join(bad)


@pytest.mark.slow
def test_every_cupy_call_fits_the_real_signature(uses):
    bad, unchecked = [], []
    for u in _of(uses, "call"):
        try:
            obj = resolve(u.target)
        except (AttributeError, ImportError):
            obj = getattr(resolve(_split_member(u.target)[0]), _split_member(u.target)[1], None)
        sig = real_signature(obj) if obj is not None else None
        if sig is None:
            unchecked.append(u.target)
            continue
        why = call_misfit(sig, *u.args)
        if why:
            bad.append(f"{u.where}: {u.target}: {why}")
    assert not bad, "calls that do not fit CuPy's signatures:\n" + "\n".join(bad)
    # the wheel exposes the signature of every call gpucheck makes but RawKernel.__call__'s
    # keyword tail (**kwargs, passed on to Function.__call__), and the typed ones are there
    assert not unchecked, unchecked


@pytest.mark.slow
def test_every_exception_gpucheck_catches_is_a_real_exception_and_none_is_made(uses):
    catches = _of(uses, "except")
    assert {u.target for u in catches} >= {"cupy.cuda.driver.CUDADriverError", "cupy.cuda.runtime.CUDARuntimeError"}
    for u in catches:
        assert isinstance(resolve(u.target), type) and issubclass(resolve(u.target), BaseException), u
    made = [u for u in _of(uses, "call") if isinstance(_resolved(u.target), type)
            and issubclass(_resolved(u.target), BaseException)]
    assert not made, f"gpucheck constructs CuPy exceptions (the stub does not model their constructors): {made}"
    # both CUDA errors are RuntimeErrors, so `except RuntimeError` paths see them (cupy_backends)
    assert issubclass(cupy.cuda.runtime.CUDARuntimeError, RuntimeError)
    assert issubclass(cupy.cuda.driver.CUDADriverError, RuntimeError)


def _resolved(path: str) -> Any:
    try:
        return resolve(path)
    except (AttributeError, ImportError):
        return None


@pytest.mark.slow
def test_every_device_property_gpucheck_reads_is_one_cupy_sets(uses):
    keys = _of(uses, "key")
    assert {u.target for u in keys} >= {"l2CacheSize", "multiProcessorCount", "totalGlobalMem", "name"}
    bad = [f"{u.where}: {u.target}" for u in keys if u.target not in DEVICE_PROPERTY_KEYS]
    assert not bad, "device properties getDeviceProperties does not return:\n" + "\n".join(bad)


def test_the_property_key_table_is_the_installed_wheels():
    """The keys are string constants in the compiled runtime module of the wheel."""
    binary = Path(importlib.import_module(cupy.cuda.runtime.CUDARuntimeError.__module__).__file__).read_bytes()
    missing = sorted(k for k in DEVICE_PROPERTY_KEYS if k.encode() not in binary)
    assert not missing, missing


def test_the_tables_name_real_members():
    for (cls, member) in list(METHODS) + list(MEMBERS):
        assert member in real_members(resolve(cls)), (cls, member)
    for path in RETURNS:
        assert callable(resolve(path)), path
    for file, function, param in PARAMS:  # no stale entry: each names a parameter in the code
        scopes = {sc.qualname: sc.node for sc in cupy_uses._scopes(ROOT / file, ROOT)}
        args = scopes[function].args
        assert param in [a.arg for a in args.posonlyargs + args.args + args.kwonlyargs], (file, function, param)


def test_the_installed_cupy_is_the_pinned_one():
    assert cupy.__version__ == CUPY_VERSION
    assert not hasattr(cupy.RawKernel, "ptr") and "kernel" in dir(cupy.RawKernel)  # fn.kernel.ptr, not fn.ptr
    assert "ptr" in dir(cupy.cuda.function.Function)


# -- the scan itself --------------------------------------------------------------------------------------
def _scan_text(tmp_path: Path, text: str, params: dict | None = None) -> set[Use]:
    (tmp_path / "m.py").write_text(text)
    t = tables()
    t.params = params or {}
    return cupy_uses.scan([tmp_path / "m.py"], tmp_path, resolve, t)


def test_the_scan_finds_a_member_the_real_class_lacks(tmp_path):
    """The filed bug: `fn.ptr` on what RawModule.get_function returns (a RawKernel)."""
    text = ("def occupancy(block):\n    import cupy\n    mod = cupy.RawModule(code='x')\n"
            "    fn = mod.get_function('k')\n"
            "    return cupy.cuda.driver.occupancyMaxActiveBlocksPerMultiprocessor({}, block, 0)\n")
    bad = _scan_text(tmp_path, text.format("fn.ptr"))
    rawkernel = class_path(cupy.RawKernel)
    assert Use("m.py:5", "member", f"{rawkernel}.ptr") in bad
    assert "ptr" not in real_members(cupy.RawKernel)
    good = _scan_text(tmp_path, text.format("fn.kernel.ptr"))
    assert {u.target for u in good if u.what == "member"} == {
        f"{class_path(cupy.RawModule)}.get_function", f"{rawkernel}.kernel", f"{class_path(cupy.cuda.function.Function)}.ptr"}
    assert Use("m.py:5", "call", "cupy.cuda.driver.occupancyMaxActiveBlocksPerMultiprocessor", (3, (), False)) in good


def test_the_scan_follows_aliases_self_attributes_and_gpuchecks_own_functions(tmp_path):
    text = ("import cupy as cp\n\nclass B:\n    def __init__(self, cupy):\n        self.c = cupy\n\n"
            "    def alloc(self):\n        rt = self.c.cuda.runtime\n        return cp.ndarray((2,), memptr=rt.x)\n\n"
            "    def use(self):\n        return self.alloc().data.ptr + self.alloc().nope\n")
    out = _scan_text(tmp_path, text)
    nd = class_path(cupy.ndarray)
    assert Use("m.py:9", "path", "cupy.cuda.runtime.x") in out
    assert {Use("m.py:12", "member", f"{nd}.data"), Use("m.py:12", "member", f"{nd}.nope")} <= out
    assert Use("m.py:12", "member", f"{class_path(cupy.cuda.MemoryPointer)}.ptr") in out


def test_the_scan_reports_what_the_tables_do_not_cover(tmp_path):
    text = ("def f(ev, buf):\n    import cupy\n    x = cupy.cuda.runtime.getDeviceProperties(0)['nokey']\n"
            "    ev.done\n    cupy.cuda.runtime.memGetInfo()\n    return cupy.cuda.runtime.deviceSynchronize().y\n")
    out = _scan_text(tmp_path, text, {("m.py", "f", "buf"): frozenset()})
    assert Use("m.py:1", "param", "f(ev)") in out and not any(u.target == "f(buf)" for u in out)
    assert Use("m.py:3", "key", "nokey") in out
    assert Use("m.py:6", "unknown", "cupy.cuda.runtime.deviceSynchronize().y") in out
    assert not any(u.what == "unknown" and "memGetInfo" in u.target for u in out)  # plain data, no members used


def test_the_signature_checks_tell_a_misfit():
    occ = real_signature(cupy.cuda.driver.occupancyMaxActiveBlocksPerMultiprocessor)
    assert occ == [("func", "any", False), ("blockSize", "any", False), ("dynamicSMemSize", "any", False)]
    assert call_misfit(occ, 3, (), False) is None
    assert call_misfit(occ, 2, (), False) == "missing dynamicSMemSize"
    assert call_misfit(occ, 4, (), False) == "4 positional arguments, the real one takes 3"
    assert signature_misfit([("func", "any", False), ("block", "any", False), ("smem", "any", False)], occ) == \
        "parameter 'block': the real one has none"
    assert signature_misfit([("func", "any", False)], occ) == "missing required blockSize, dynamicSMemSize"
    nd = real_signature(cupy.ndarray)
    assert [n for n, _, _ in nd] == ["shape", "dtype", "memptr", "strides", "order"]
    assert call_misfit(nd, 1, ("dtype", "memptr"), False) is None and call_misfit(nd, 1, ("mem",), False)


# -- (c) the fake against the real --------------------------------------------------------------------------
def test_every_class_of_the_fake_stands_for_a_real_class_or_is_test_side():
    classes = {n.name for n in ast.walk(ast.parse(FAKE_SOURCE.read_text())) if isinstance(n, ast.ClassDef)}
    unmapped = sorted(classes - set(FAKE_TO_REAL) - set(TEST_SIDE))
    assert not unmapped, f"classes in tests/fakecupy.py with no real counterpart (map them in FAKE_TO_REAL): {unmapped}"
    assert not set(FAKE_TO_REAL) & set(TEST_SIDE)
    for name, path in FAKE_TO_REAL.items():
        assert name in classes and resolve(path) is not None, name
        if name != "FakeCupyModule":
            assert isinstance(resolve(path), type) and resolve(path).__name__ == name, (name, path)


@pytest.fixture(scope="module")
def fake():
    why = cudaemu.usable()
    if why:
        pytest.skip(why)
    return fakecupy.FakeCupy()


def fake_instances(fake) -> list[Any]:
    """One stub object of every kind the fake makes."""
    m = fake.module
    mem = m.cuda.Memory(64)
    ptr = m.cuda.MemoryPointer(mem, 0)
    arr = m.ndarray((8,), m.uint64, memptr=ptr)
    mod = m.RawModule(code=source("memtest"), options=("--std=c++17",))
    ker = mod.get_function("memtest_scrub")
    base = type(m.cuda.Stream.null).__mro__[1]
    return [mem, ptr, arr, arr[2:4], m.cuda.Stream.null, m.cuda.ExternalStream(5, 0), base(7, 0), m.cuda.Event(),
            m.cuda.Device(0), mod, ker, ker.kernel, fakecupy.CUDARuntimeError("x"), fakecupy.CUDADriverError("x")]


def _fake_members(obj: Any) -> tuple[set[str], set[str]]:
    """(public members and dunders the fake's class bodies define, private names) of a stub object."""
    names = set(dir(obj))
    own = {n for c in type(obj).__mro__ if c.__module__ == "fakecupy" for n in vars(c)}
    public = {n for n in names if not n.startswith("_")} | {n for n in own if n.startswith("__")} - PYTHON_DUNDERS
    private = {n for n in names if n.startswith("_") and not n.startswith("__")}
    return public, private


@pytest.mark.slow
def test_no_fake_class_has_a_member_its_real_class_lacks(fake):
    bad = []
    for obj in fake_instances(fake):
        real = resolve(FAKE_TO_REAL[type(obj).__name__])
        public, private = _fake_members(obj)
        have = real_members(real)
        bad += [f"{type(obj).__name__}.{n}: not on {class_path(real)}" for n in sorted(public - have)]
        bad += [f"{type(obj).__name__}.{n}: private state under a name {class_path(real)} uses"
                for n in sorted(private & have)]
        for n in sorted(public & have - {n for n in public if n.startswith("__")}):
            fake_method = callable(getattr(type(obj), n, None)) and not isinstance(getattr(type(obj), n), type)
            real_attr = inspect.getattr_static(real, n, None)
            real_method = callable(real_attr) and not isinstance(real_attr, type)
            if fake_method != real_method:
                bad.append(f"{type(obj).__name__}.{n}: a {'method' if fake_method else 'data member'} here, "
                           f"not on {class_path(real)}")
    assert not bad, "the fake models members the real CuPy does not have:\n" + "\n".join(bad)


def test_the_real_python_classes_instance_attributes_are_documented():
    """documented_attributes() stands for what real instances carry: check it on the ones that can
    be made without a GPU (a Python-level CuPy class keeps its attributes per instance)."""
    for path, obj in real_instances().items():
        public = {n for n in vars(obj) if not n.startswith("_")}
        assert public == documented_attributes(resolve(path)) == {"ptr", "device_id"}, path
    assert documented_attributes(cupy.cuda.Event) == {"ptr"}


def test_the_stub_modules_hold_only_names_the_real_ones_have(fake):
    bad = []

    def walk(stub: Any, real: Any, where: str) -> None:
        for name, value in vars(stub).items():
            if name in MODULE_DUNDERS:
                continue
            if not hasattr(real, name):
                bad.append(f"{where}.{name}: not in the real {where}")
                continue
            rv = getattr(real, name)
            if isinstance(value, type(sys)):
                walk(value, rv, f"{where}.{name}")
            elif isinstance(value, type) and value.__module__ == "fakecupy":
                if resolve(FAKE_TO_REAL[value.__name__]) is not rv:
                    bad.append(f"{where}.{name}: maps to {FAKE_TO_REAL[value.__name__]}, the real name is {rv}")
            elif isinstance(value, type):
                if value is not rv:  # e.g. cupy.uint64 is NumPy's
                    bad.append(f"{where}.{name} is {value}, the real one is {rv}")
            elif name == "__version__":
                if value != f"{rv}+fakecupy":
                    bad.append(f"{where}.__version__ {value!r}: models {rv!r}?")
            elif not callable(value) and value != rv:
                bad.append(f"{where}.{name} = {value!r}, the real one is {rv!r}")

    walk(fake.module, cupy, "cupy")
    assert not bad, "\n".join(bad)


def _stub_callables(fake) -> list[tuple[str, Any, Any]]:
    """(name, fake callable, real callable): the stub's module functions, every class's
    constructor and every public method it defines."""
    out = []

    def walk(stub: Any, real: Any, where: str) -> None:
        for name, value in vars(stub).items():
            if isinstance(value, type(sys)):
                walk(value, getattr(real, name), f"{where}.{name}")
            elif callable(value) and not isinstance(value, type) and hasattr(real, name):
                out.append((f"{where}.{name}", value, getattr(real, name)))

    walk(fake.module, cupy, "cupy")
    for obj in fake_instances(fake):
        cls, real = type(obj), resolve(FAKE_TO_REAL[type(obj).__name__])
        if issubclass(cls, BaseException):
            continue  # constructors not modelled (gpucheck never makes one: checked above)
        out.append((f"{cls.__name__}()", cls, real))
        for name, member in vars(cls).items():
            if inspect.isfunction(member) and (not name.startswith("_") or name == "__call__"):
                out.append((f"{cls.__name__}.{name}", member, getattr(real, name)))
    return out


def test_the_fakes_functions_take_the_real_parameters(fake):
    bad, unexposed = [], []
    for name, fn, real in _stub_callables(fake):
        real_sig = real_signature(real)
        if real_sig is None:
            unexposed.append(name)
            continue
        why = signature_misfit(inspect_signature(fn), real_sig)
        if why:
            bad.append(f"{name}: {why} (real: {real_sig})")
    assert not bad, "the fake's parameters are not the real ones:\n" + "\n".join(bad)
    assert not unexposed, f"the wheel exposes no signature of {unexposed}: compare them another way"


def test_the_fakes_exceptions_have_the_real_hierarchy():
    for fake_cls in (fakecupy.CUDARuntimeError, fakecupy.CUDADriverError):
        real = resolve(FAKE_TO_REAL[fake_cls.__name__])
        builtins = [c for c in real.__mro__ if c.__module__ == "builtins"]
        assert [c for c in fake_cls.__mro__ if c.__module__ == "builtins"] == builtins, fake_cls


def test_raw_module_takes_keyword_arguments_only_and_a_tuple_of_options(fake):
    """What Cython's class docstring does not say right (it shows `code` as positional)."""
    for raw_module in (cupy.RawModule, fake.module.RawModule):
        with pytest.raises(TypeError):
            raw_module("extern \"C\" __global__ void k() {}")
        with pytest.raises(TypeError):
            raw_module(code="", options=["--std=c++17"])
    assert cupy.RawModule(code="x", options=("--std=c++17",)).options == ("--std=c++17",)


def test_the_fakes_device_properties_are_real_keys(fake):
    assert set(fake.module.cuda.runtime.getDeviceProperties(0)) <= DEVICE_PROPERTY_KEYS
