"""Backend plugins import the core through its public API only.

Every Python file of ``plugins/*/`` and ``examples/plugin_template/`` (code, tests, benchmarks)
may import from ``sparsetorch``, ``sparsetorch.backend`` (the backend-author namespace),
``sparsetorch.format``, ``sparsetorch.testing`` and its own package. The core's other modules
(``sparsetorch.dispatch``, ``ops``, ``tensor``, ``autograd``, ``backends``, the ``_``-prefixed
ones, ...) may change without notice, so a plugin that reaches into one breaks on a core
upgrade. Imports inside functions count; so do ``importlib.import_module`` /
``pytest.importorskip`` calls with a literal name and the code strings a test hands to a
subprocess (``python -c "..."``).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: The public modules a plugin may import (and their submodules), besides ``sparsetorch`` itself.
PUBLIC = ("sparsetorch.backend", "sparsetorch.format", "sparsetorch.testing")
#: Core subpackages and modules that are not public: ``from sparsetorch import <one>`` imports it.
CORE_MODULES = {"dispatch", "ops", "tensor", "autograd", "backends", "errors", "cli", "demo"}
_SKIP_DIRS = {"build", "__pycache__", ".pytest_cache"}


def plugin_files() -> list[Path]:
    dirs = sorted(p for p in (ROOT / "plugins").iterdir() if p.is_dir()) + [ROOT / "examples" / "plugin_template"]
    out = []
    for d in dirs:
        for f in sorted(d.rglob("*.py")):
            if not any(part in _SKIP_DIRS or part.endswith(".egg-info") for part in f.relative_to(d).parts):
                out.append(f)
    return out


def allowed(module: str) -> bool:
    """``module`` (a dotted name) is outside the core, the package itself, or a public module."""
    if module == "sparsetorch" or not module.startswith("sparsetorch."):
        return True
    return any(module == p or module.startswith(p + ".") for p in PUBLIC)


def _private_name(name: str) -> bool:
    return name in CORE_MODULES or (name.startswith("_") and not name.startswith("__"))


def imports(tree: ast.AST, line_offset: int = 0) -> list[tuple[int, str]]:
    """(line, module) of every absolute import in ``tree``: statements anywhere (functions
    included), ``from sparsetorch import x`` as ``sparsetorch.x`` when ``x`` is a core module,
    literal ``import_module``/``importorskip`` names, and string constants that parse as code
    importing sparsetorch (what a test runs in a subprocess)."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        line = line_offset + getattr(node, "lineno", 0)
        if isinstance(node, ast.Import):
            found += [(line, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((line, node.module))
            if node.module == "sparsetorch":
                found += [(line, f"sparsetorch.{a.name}") for a in node.names if _private_name(a.name)]
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            fn = node.func
            name = fn.attr if isinstance(fn, ast.Attribute) else getattr(fn, "id", "")
            if name in ("import_module", "importorskip", "__import__") and isinstance(node.args[0].value, str):
                found.append((line, node.args[0].value))
        elif (isinstance(node, ast.Constant) and isinstance(node.value, str) and "sparsetorch" in node.value
              and "import" in node.value):
            try:
                inner = ast.parse(node.value)
            except SyntaxError:
                continue
            found += imports(inner, line - 1)
    return found


def test_the_scan_finds_plugin_files() -> None:
    files = plugin_files()
    plugins = {f.relative_to(ROOT).parts[1] for f in files if f.relative_to(ROOT).parts[0] == "plugins"}
    assert {"scipy_backend", "eigen_backend", "cupy_backend", "cudss_backend", "cuda_kernels", "distributed"} <= plugins
    assert any(f.relative_to(ROOT).parts[:2] == ("examples", "plugin_template") for f in files)


def test_the_scan_sees_every_kind_of_import() -> None:
    src = '''
import sparsetorch.ops.solve
def f():
    from sparsetorch.dispatch.records import Request
    import importlib; importlib.import_module("sparsetorch.tensor.construct")
from sparsetorch import dispatch, Offer, __version__
code = "from sparsetorch.autograd import handles; print(1)"
from sparsetorch.backend import rates
from sparsetorch.testing.problems import poisson2d
import sparsetorch, numpy
'''
    bad = sorted((line, m) for line, m in imports(ast.parse(src)) if not allowed(m))
    assert bad == [(2, "sparsetorch.ops.solve"), (4, "sparsetorch.dispatch.records"), (5, "sparsetorch.tensor.construct"),
                   (6, "sparsetorch.dispatch"), (7, "sparsetorch.autograd")]


@pytest.mark.parametrize("path", plugin_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_plugin_imports_only_public_modules(path: Path) -> None:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    bad = [f"{path.relative_to(ROOT)}:{line}: imports {module}" for line, module in imports(tree) if not allowed(module)]
    assert not bad, ("private core modules imported; use sparsetorch.backend (or sparsetorch, sparsetorch.format, "
                     "sparsetorch.testing), adding there what is missing:\n  " + "\n  ".join(bad))
