"""Every use gpucheck makes of CuPy, read from its source by AST, not from a hand list: the
`cupy.…` attribute chains, the members it uses on the objects CuPy gives it, the calls it makes
(with how many positional arguments and which keywords), the exceptions it catches and the
device-property keys it reads. tests/test_cupy_conformance.py checks each against the real CuPy.

    uses = cupy_uses.scan(files, root, resolve, tables)   # a set of Use

How a value is known to be CuPy's (flow-insensitive, per function, iterated to a fixed point):
- `import cupy [as x]`, `from cupy[.a] import b [as y]` and a parameter named `cupy` are CuPy paths;
- `x = <expr>`, `a, b = x, y`, `with <expr> as x` and `self.x = <expr>` (in any method of the
  class) carry the expression's kind; `a or b` and `a if c else b` are either kind;
- an attribute of a path is a path (`cupy.cuda.Event`); calling a path that is a class makes an
  instance of it (a path that is an instance, `cupy.cuda.Stream.null`, is one of its class);
  calling a function path gives what `tables.returns` says it returns;
- a member of an instance has the kind `tables.members` says, a method call returns what
  `tables.methods` says (looked up along the real class's MRO);
- a gpucheck function returns the union of its `return` expressions' kinds (in its own file, or
  imported from a scanned file with `from .x import f` / `from . import x`);
- a parameter is what `tables.params` says, for every parameter used as an object (an attribute
  read, called, subscripted or `with`-entered) in a function that touches CuPy or a method of a
  class that holds it.
Where the tables say nothing and the code then uses the value as an object, the use is reported
as `unknown` (or `param`): the conformance test fails, so the tables grow with the code.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

CUPY_KINDS = ("path", "inst", "props", "unknown")


@dataclass(frozen=True)
class Use:
    where: str  # "gpucheck/kernels/cupy_module.py:97"
    what: str  # path | member | call | key | except | unknown | param
    target: str  # a path, "class path.member", a key, or what is unknown
    args: tuple = ()  # calls: (positional count, keyword names, has *args/**kw)


@dataclass
class Tables:
    """What CuPy's functions return and its instances' members are (class paths canonical, as
    `resolve` + class_path give them); atoms: ("inst", class path), ("props",)."""
    returns: dict[str, frozenset]
    methods: dict[tuple[str, str], frozenset]
    members: dict[tuple[str, str], frozenset]
    params: dict[tuple[str, str, str], frozenset]  # (file, function qualname, parameter)


def class_path(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


@dataclass
class _State:
    root: Path
    resolve: Callable[[str], Any]
    tables: Tables
    returns: dict[tuple[str, str], frozenset] = field(default_factory=dict)  # gpucheck functions
    self_attrs: dict[tuple[str, str, str], frozenset] = field(default_factory=dict)  # (file, class, attr)
    uses: set[Use] | None = None  # collected on the last pass only


@dataclass
class _Scope:
    file: str
    qualname: str
    cls: str | None  # the enclosing class of a method
    node: ast.AST
    module_names: dict[str, frozenset]  # names bound at module level (imports, functions)
    env: dict[str, frozenset] = field(default_factory=dict)
    touches: bool = False


def scan(files: list[Path], root: Path, resolve: Callable[[str], Any], tables: Tables) -> set[Use]:
    """Every CuPy use in `files` (paths under `root`); `resolve(path)` is the real object at a
    dotted path (AttributeError/ImportError when there is none)."""
    st = _State(root, resolve, tables)
    scopes = [s for f in files for s in _scopes(f, root)]
    for last in (False, False, False, False, True):
        st.uses = set() if last else None
        for sc in scopes:
            _run_scope(st, sc)
    return st.uses or set()


def _scopes(path: Path, root: Path) -> list[_Scope]:
    rel = str(path.relative_to(root))
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=rel)
    names = _module_names(tree, rel, root)
    out = [_Scope(rel, "<module>", None, tree, names)]

    def visit(node: ast.AST, prefix: str, cls: str | None) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.", child.name)
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                out.append(_Scope(rel, prefix + child.name, cls, child, names))
                visit(child, f"{prefix}{child.name}.", None)
            else:
                visit(child, prefix, cls)

    visit(tree, "", None)
    return out


def _module_names(tree: ast.Module, rel: str, root: Path) -> dict[str, frozenset]:
    """Module-level functions and imports of gpucheck modules, as ("func", file, name) /
    ("gmod", file) atoms, and module-level imports of cupy."""
    names = _cupy_imports(_own_nodes(tree))
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names[node.name] = frozenset({("func", rel, node.name)})
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = _relative_module(rel, node.level, node.module)
            for a in node.names:
                as_module = root / (base / a.name).with_suffix(".py")
                if as_module.is_file():
                    names[a.asname or a.name] = frozenset({("gmod", str(as_module.relative_to(root)))})
                elif (root / base.with_suffix(".py")).is_file():
                    names[a.asname or a.name] = frozenset({("func", str(base.with_suffix(".py")), a.name)})
                elif (root / base / "__init__.py").is_file():
                    names[a.asname or a.name] = frozenset({("func", str(base / "__init__.py"), a.name)})
    return names


def _relative_module(rel: str, level: int, module: str | None) -> Path:
    pkg = Path(rel).parent
    for _ in range(level - 1):
        pkg = pkg.parent
    return pkg / Path(*module.split(".")) if module else pkg


def _run_scope(st: _State, sc: _Scope) -> None:
    sc.env = dict(sc.module_names)
    _seed(st, sc)
    body = _own_nodes(sc.node)
    for _ in range(2):
        for node in body:
            _bind(st, sc, node)
    if sc.cls and any(k[0] == sc.file and k[1] == sc.cls and _is_cupy(v) for k, v in st.self_attrs.items()):
        sc.touches = True
    for node in body:
        if isinstance(node, ast.expr):
            _type(st, sc, node)
        elif isinstance(node, ast.ExceptHandler) and node.type is not None:
            _excepts(st, sc, node.type)
        elif isinstance(node, ast.withitem):
            _entered(st, sc, node.context_expr)
        elif isinstance(node, ast.Return) and node.value is not None and sc.qualname != "<module>":
            key = (sc.file, sc.qualname)
            st.returns[key] = st.returns.get(key, frozenset()) | _type(st, sc, node.value)
    if st.uses is not None and sc.touches:
        _check_params(st, sc, body)


def _own_nodes(scope: ast.AST) -> list[ast.AST]:
    """The nodes of a scope, not those of the functions and classes defined inside it."""
    out: list[ast.AST] = []
    todo = list(ast.iter_child_nodes(scope))
    while todo:
        node = todo.pop(0)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        out.append(node)
        todo.extend(ast.iter_child_nodes(node))
    return out


def _cupy_imports(nodes: list[ast.AST]) -> dict[str, frozenset]:
    """The names `import cupy [as x]` and `from cupy[.a] import b [as y]` bind among `nodes`."""
    out: dict[str, frozenset] = {}
    for node in nodes:
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name == "cupy" or a.name.startswith("cupy."):
                    top = a.asname or a.name.split(".")[0]
                    out[top] = frozenset({("path", a.name if a.asname else "cupy")})
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module and \
                (node.module == "cupy" or node.module.startswith("cupy.")):
            for a in node.names:
                out[a.asname or a.name] = frozenset({("path", f"{node.module}.{a.name}")})
    return out


def _seed(st: _State, sc: _Scope) -> None:
    """Imports of cupy and parameters named `cupy` (the module passed in)."""
    sc.env.update(_cupy_imports(_own_nodes(sc.node)))
    args = getattr(sc.node, "args", None)
    if args is not None:
        for a in args.posonlyargs + args.args + args.kwonlyargs:
            if a.arg == "cupy":
                sc.env["cupy"] = frozenset({("path", "cupy")})
            elif (sc.file, sc.qualname, a.arg) in st.tables.params:
                sc.env[a.arg] = st.tables.params[(sc.file, sc.qualname, a.arg)]


def _bind(st: _State, sc: _Scope, node: ast.AST) -> None:
    if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
        kinds = _type(st, sc, node.value)
        for t in (node.targets if isinstance(node, ast.Assign) else [node.target]):
            _assign(st, sc, t, kinds, node.value)
    elif isinstance(node, ast.withitem) and node.optional_vars is not None:
        _assign(st, sc, node.optional_vars, _type(st, sc, node.context_expr))


def _assign(st: _State, sc: _Scope, target: ast.AST, kinds: frozenset, value: ast.AST | None = None) -> None:
    if isinstance(target, ast.Tuple) and isinstance(value, ast.Tuple) and len(target.elts) == len(value.elts):
        for t, v in zip(target.elts, value.elts):  # a, b = x, y
            _assign(st, sc, t, _type(st, sc, v), v)
        return
    if not kinds:
        return
    if isinstance(target, ast.Name):
        sc.env[target.id] = sc.env.get(target.id, frozenset()) | kinds
    elif isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id == "self" \
            and sc.cls:
        key = (sc.file, sc.cls, target.attr)
        st.self_attrs[key] = st.self_attrs.get(key, frozenset()) | kinds


def _is_cupy(kinds: frozenset) -> bool:
    return any(k[0] in CUPY_KINDS for k in kinds)


def _where(sc: _Scope, node: ast.AST) -> str:
    return f"{sc.file}:{getattr(node, 'lineno', 0)}"


def _emit(st: _State, use: Use) -> None:
    if st.uses is not None:
        st.uses.add(use)


def _type(st: _State, sc: _Scope, node: ast.AST) -> frozenset:
    """The kinds of value `node` may be (an empty set: nothing CuPy's, nothing known)."""
    if isinstance(node, ast.Name):
        if node.id == "self" and sc.cls:
            return frozenset({("self", sc.file, sc.cls)})
        kinds = sc.env.get(node.id, frozenset())
    elif isinstance(node, ast.Attribute):
        kinds = _attribute(st, sc, node)
    elif isinstance(node, ast.Call):
        kinds = _call(st, sc, node)
    elif isinstance(node, ast.BoolOp):
        kinds = frozenset().union(*(_type(st, sc, v) for v in node.values))
    elif isinstance(node, ast.IfExp):
        kinds = _type(st, sc, node.body) | _type(st, sc, node.orelse)
    elif isinstance(node, ast.Subscript):
        kinds = _subscript(st, sc, node)
    else:
        kinds = frozenset()
    if _is_cupy(kinds):
        sc.touches = True
    return kinds


def _attribute(st: _State, sc: _Scope, node: ast.Attribute, calling: bool = False) -> frozenset:
    """The kinds of `x.attr`; with `calling`, an instance's member is a method that _call types."""
    out: set = set()
    for k in _type(st, sc, node.value):
        if k[0] == "path":
            path = f"{k[1]}.{node.attr}"
            _emit(st, Use(_where(sc, node), "path", path))
            out.add(("path", path))
        elif k[0] == "inst":
            _emit(st, Use(_where(sc, node), "member", f"{k[1]}.{node.attr}"))
            if not calling:
                out |= _lookup(st, st.tables.members, k[1], node.attr) or {("unknown", f"{k[1]}.{node.attr}")}
        elif k[0] == "unknown":
            _emit(st, Use(_where(sc, node), "unknown", f"{k[1]}.{node.attr}"))
        elif k[0] == "self":
            out |= st.self_attrs.get((k[1], k[2], node.attr), frozenset())
            out.add(("func", k[1], f"{k[2]}.{node.attr}"))
        elif k[0] == "gmod":
            out.add(("func", k[1], node.attr))
    return frozenset(out)


def _lookup(st: _State, table: dict, cls_path: str, name: str) -> frozenset | None:
    """table[(class, name)] for the class or the first of its real bases that has an entry."""
    try:
        mro = [class_path(c) for c in st.resolve(cls_path).__mro__]
    except (AttributeError, ImportError):
        mro = [cls_path]
    for c in mro:
        if (c, name) in table:
            return table[(c, name)]
    return None


def _call_args(node: ast.Call) -> tuple:
    star = any(isinstance(a, ast.Starred) for a in node.args) or any(k.arg is None for k in node.keywords)
    return (sum(not isinstance(a, ast.Starred) for a in node.args),
            tuple(sorted(k.arg for k in node.keywords if k.arg)), star)


def _call(st: _State, sc: _Scope, node: ast.Call) -> frozenset:
    out: set = set()
    where, args = _where(sc, node), _call_args(node)
    if isinstance(node.func, ast.Attribute):  # a method of an instance: tables.methods
        for k in _type(st, sc, node.func.value):
            if k[0] == "inst":
                _emit(st, Use(where, "call", f"{k[1]}.{node.func.attr}", args))
                out |= _lookup(st, st.tables.methods, k[1], node.func.attr) or \
                    {("unknown", f"{k[1]}.{node.func.attr}()")}
            elif k[0] == "props" and node.func.attr == "get" and node.args and \
                    isinstance(node.args[0], ast.Constant):
                _emit(st, Use(where, "key", str(node.args[0].value)))
    func = _attribute(st, sc, node.func, calling=True) if isinstance(node.func, ast.Attribute) else \
        _type(st, sc, node.func)
    for k in func:
        if k[0] == "path":
            out |= _call_path(st, where, k[1], args)
        elif k[0] == "inst":  # calling an instance
            _emit(st, Use(where, "member", f"{k[1]}.__call__"))
            _emit(st, Use(where, "call", f"{k[1]}.__call__", args))
            out |= _lookup(st, st.tables.methods, k[1], "__call__") or {("unknown", f"{k[1]}()")}
        elif k[0] == "unknown":
            _emit(st, Use(where, "unknown", f"{k[1]}()"))
        elif k[0] == "func":
            out |= st.returns.get((k[1], k[2]), frozenset())
    return frozenset(out)


def _call_path(st: _State, where: str, path: str, args: tuple) -> set:
    _emit(st, Use(where, "call", path, args))
    try:
        obj = st.resolve(path)
    except (AttributeError, ImportError):
        return set()  # reported by the path check
    if isinstance(obj, type):
        return {("inst", class_path(obj))}
    if path in st.tables.returns:
        return set(st.tables.returns[path])
    return {("unknown", f"{path}()")}


def _subscript(st: _State, sc: _Scope, node: ast.Subscript) -> frozenset:
    out: set = set()
    for k in _type(st, sc, node.value):
        if k[0] == "props" and isinstance(node.slice, ast.Constant):
            _emit(st, Use(_where(sc, node), "key", str(node.slice.value)))
        elif k[0] == "inst":
            _emit(st, Use(_where(sc, node), "member", f"{k[1]}.__getitem__"))
            out |= _lookup(st, st.tables.methods, k[1], "__getitem__") or {("unknown", f"{k[1]}[...]")}
        elif k[0] == "unknown":
            _emit(st, Use(_where(sc, node), "unknown", f"{k[1]}[...]"))
    return frozenset(out)


def _excepts(st: _State, sc: _Scope, node: ast.expr) -> None:
    for e in (node.elts if isinstance(node, ast.Tuple) else [node]):
        for k in _type(st, sc, e):
            if k[0] == "path":
                _emit(st, Use(_where(sc, e), "except", k[1]))


def _entered(st: _State, sc: _Scope, node: ast.expr) -> None:
    for k in _type(st, sc, node):
        if k[0] == "inst":
            _emit(st, Use(_where(sc, node), "member", f"{k[1]}.__enter__"))
            _emit(st, Use(_where(sc, node), "member", f"{k[1]}.__exit__"))
        elif k[0] == "unknown":
            _emit(st, Use(_where(sc, node), "unknown", f"with {k[1]}"))


def _check_params(st: _State, sc: _Scope, body: list[ast.AST]) -> None:
    """A `param` use for every parameter used as an object that neither a parameter named cupy
    nor tables.params accounts for."""
    args = getattr(sc.node, "args", None)
    if args is None:
        return
    names = [a.arg for a in args.posonlyargs + args.args + args.kwonlyargs]
    names += [a.arg for a in (args.vararg, args.kwarg) if a is not None]
    used = set()
    for node in body:
        for base in _object_uses(node):
            if isinstance(base, ast.Name):
                used.add(base.id)
    for p in names:
        if p in used and p not in ("self", "cls", "cupy") and (sc.file, sc.qualname, p) not in st.tables.params:
            _emit(st, Use(f"{sc.file}:{sc.node.lineno}", "param", f"{sc.qualname}({p})"))


def _object_uses(node: ast.AST) -> list[ast.AST]:
    if isinstance(node, (ast.Attribute, ast.Subscript)):
        return [node.value]
    if isinstance(node, ast.Call):
        return [node.func]
    if isinstance(node, ast.withitem):
        return [node.context_expr]
    return []
