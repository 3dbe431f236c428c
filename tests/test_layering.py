"""The core's import graph: layers import only downward, and module-level imports form no cycle.

Layers, lowest first (docs/dispatch.md, "Layers"):

0. ``errors``, ``_markers``, ``_version``, ``_after_import``: what everything may use;
1. ``format``: the format DSL;
2. ``tensor``: SparseTensor, validation, conversion, interop;
3. ``dispatch``: the plugin contract (records, plans, results, the accuracy contract), the
   manager, selection, caches;
4. ``autograd``: the adjoint rules, handles, the fallback route;
5. ``ops``: the public operations (they build requests, choose plans, call the Functions);
6. ``backends``: the built-in torch backend (a plugin that ships with the core);
7. facades: the package itself, ``backend`` (the backend authors' namespace), ``nn``,
   ``kernels`` (user kernels registered as backends), ``testing``, ``cli``, ``demo``, ``__main__``.

An import from a lower layer to a higher one (at module level or inside a function) fails the
test, naming the file, the line and both modules. Where a lower layer needs something only a
higher one can provide, the higher one registers it (``autograd/products.py``).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "core" / "sparsetorch"

LAYERS = {
    "errors": 0, "_markers": 0, "_version": 0, "_after_import": 0,
    "format": 1,
    "tensor": 2,
    "dispatch": 3,
    "autograd": 4,
    "ops": 5,
    "backends": 6,
    "": 7, "backend": 7, "nn": 7, "kernels": 7, "testing": 7, "cli": 7, "demo": 7, "__main__": 7,
}

#: (importing module, imported module) pairs allowed to cross upward, each with its reason
ALLOWED: dict[tuple[str, str], str] = {
    # a matrix-free Jacobian is a function, which sparsetorch.solve / Solver do not take: the
    # nonlinear solver calls the torch backend's GMRES on it directly (one place:
    # Problem.operator_solve)
    ("sparsetorch.ops.nonlinear._problem", "sparsetorch.backends.torch_native.krylov"): "matrix-free GMRES",
    ("sparsetorch.ops.nonlinear._problem", "sparsetorch.backends.torch_native.krylov.gmres"): "matrix-free GMRES",
}


def _modules() -> dict[str, Path]:
    out = {}
    for p in ROOT.rglob("*.py"):
        parts = list(p.relative_to(ROOT.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = p
    return out


def _imports(name: str, path: Path, mods: dict[str, Path]):
    """(line, imported module, at module level) for every sparsetorch import of the file."""
    tree = ast.parse(path.read_text(), str(path))
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    top = {id(n) for n in tree.body}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            names = [f"{target}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            target, names = "", [a.name for a in node.names]
        else:
            continue
        for t in ([target] if target else []) + names:
            if not t.startswith("sparsetorch"):
                continue
            while t not in mods and "." in t:
                t = t.rsplit(".", 1)[0]
            if t in mods and t != name:
                yield node.lineno, t, id(node) in top


def _layer(module: str) -> int:
    parts = module.split(".")
    return LAYERS[parts[1] if len(parts) > 1 else ""]


def test_every_module_has_a_layer():
    missing = sorted({m.split(".")[1] for m in _modules() if "." in m} - set(LAYERS))
    assert not missing, f"add these top-level modules/packages to LAYERS: {missing}"


def test_no_import_runs_up_the_layers():
    mods = _modules()
    bad: list[str] = []
    for name, path in sorted(mods.items()):
        for line, target, _ in sorted(set(_imports(name, path, mods))):
            if _layer(target) > _layer(name) and (name, target) not in ALLOWED:
                bad.append(f"{path.relative_to(ROOT.parent)}:{line}: {name} (layer {_layer(name)}) imports {target} "
                           f"(layer {_layer(target)})")
    assert not bad, "imports running up the layers:\n" + "\n".join(bad)


def test_module_level_imports_form_no_cycle():
    mods = _modules()
    graph = {name: sorted({t for _, t, top in _imports(name, path, mods) if top}) for name, path in mods.items()}
    # a package's __init__ importing its own submodules, and a submodule importing a sibling
    # through the package, are the same import: cycles through a package and its children are
    # resolved by Python's import order and are not counted
    def related(a: str, b: str) -> bool:
        return a.startswith(b + ".") or b.startswith(a + ".")

    cycles = []
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(v: str) -> None:
        state[v] = 1
        stack.append(v)
        for w in graph.get(v, ()):
            if related(v, w):
                continue
            if state.get(w) == 1:
                cyc = stack[stack.index(w):] + [w]
                if not any(related(x, y) for x, y in zip(cyc, cyc[1:])):
                    cycles.append(" -> ".join(cyc))
            elif w not in state:
                visit(w)
        stack.pop()
        state[v] = 2

    for v in sorted(graph):
        if v not in state:
            visit(v)
    assert not cycles, "module-level import cycles:\n" + "\n".join(cycles)
