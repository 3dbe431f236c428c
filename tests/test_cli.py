"""The ``sparsetorch`` command line: ``info`` works and stays import-light."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

import sparsetorch.cli


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, timeout=300, check=False
    )


def test_module_info_exits_zero_and_prints_torch_version() -> None:
    proc = _run("-m", "sparsetorch", "info")
    assert proc.returncode == 0, proc.stderr
    assert torch.__version__ in proc.stdout
    assert "sparsetorch" in proc.stdout


def test_main_info_returns_zero(capsys) -> None:
    assert sparsetorch.cli.main(["info"]) == 0
    out = capsys.readouterr().out
    assert torch.__version__ in out


def test_info_does_not_import_optional_packages() -> None:
    code = (
        "import json, sys\n"
        "from sparsetorch.cli import main\n"
        "rc = main(['info'])\n"
        "mods = [m for m in ('scipy', 'cupy', 'pyamg', 'nvmath', 'torch_sla')"
        " if m in sys.modules]\n"
        "print(json.dumps({'rc': rc, 'imported': mods}))\n"
    )
    proc = _run("-c", code)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result == {"rc": 0, "imported": []}


def test_no_subcommand_is_a_usage_error(capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        sparsetorch.cli.main([])
    assert exc.value.code == 2
    assert "info" in capsys.readouterr().err
