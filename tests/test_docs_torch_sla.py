"""docs/coming-from-torch-sla.md runs: its ```python blocks are executed in order, in one namespace (as the
UST page's are), each compiled with its line number in the page so a failure points at the snippet."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.usefixtures("single_thread")

PAGE = Path(__file__).resolve().parents[1] / "docs" / "coming-from-torch-sla.md"
_BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def test_snippets_run_in_order(capsys) -> None:
    text = PAGE.read_text()
    blocks = [(text[: m.start()].count("\n") + 2, m.group(1)) for m in _BLOCK.finditer(text)]
    assert len(blocks) >= 5
    namespace: dict = {"__name__": "coming_from_torch_sla"}
    for line, code in blocks:
        exec(compile("\n" * (line - 1) + code, str(PAGE), "exec"), namespace)  # noqa: S102 - the page's own code
    assert "solve" in capsys.readouterr().out  # the explain table printed
