"""docs/coming-from-ust.md runs: its ```python blocks are executed in order, in one namespace.

Each block is compiled with its line number in the page, so a failure points at the snippet.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.usefixtures("single_thread")

PAGE = Path(__file__).resolve().parents[1] / "docs" / "coming-from-ust.md"
_BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def _blocks() -> list[tuple[int, str]]:
    text = PAGE.read_text()
    return [(text[: m.start()].count("\n") + 2, m.group(1)) for m in _BLOCK.finditer(text)]


def test_the_page_has_snippets_for_every_section() -> None:
    text = PAGE.read_text()
    assert len(_blocks()) >= 6
    for name in ("get_value", "copy_", "set_kernel", "run_kernel", "register_kernel", "reformat_model", "TorchUST",
                 "Matmul", "matmul", "TensorFormat", "NamedFormats", "dim2lvl", "reset_operands_unchecked",
                 "to_package", "from_package", "from_file", "prune_model"):
        assert f"`{name}" in text or f"{name}(" in text, name


def test_snippets_run_in_order() -> None:
    namespace: dict = {"__name__": "coming_from_ust"}
    from sparsetorch.backend import get_backends

    before = set(get_backends().names)
    for line, code in _blocks():
        # pad with newlines so tracebacks show the page's own line numbers
        exec(compile("\n" * (line - 1) + code, str(PAGE), "exec"), namespace)  # noqa: S102 - the page's own code
    assert set(get_backends().names) == before  # the snippets leave no kernel registered
