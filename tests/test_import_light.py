"""``import sparsetorch`` (and its format and tensor packages) loads torch and NumPy only: no
optional dependency is imported until an operation needs it."""

from __future__ import annotations

import json
import subprocess
import sys

OPTIONAL = ("scipy", "cupy", "pyamg", "nvmath")


def _imported_after(code: str) -> dict:
    probe = (
        f"{code}\n"
        "import json, sys\n"
        f"print(json.dumps({{'imported': sorted(m for m in sys.modules if m.split('.')[0] in {OPTIONAL!r})}}))\n"
    )
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300,
                          check=False)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_import_does_not_load_optional_packages():
    got = _imported_after("import sparsetorch, sparsetorch.format, sparsetorch.tensor")
    assert got["imported"] == [], f"import sparsetorch pulled in {got['imported']}"


def test_core_use_does_not_load_optional_packages():
    # Building, converting and validating tensors needs none of them either.
    code = (
        "import torch, sparsetorch as st\n"
        "from sparsetorch.format import CSR, DIA, BSR, DELTA, NM, TensorFormat\n"
        "A = torch.eye(4, dtype=torch.float64)\n"
        "t = st.SparseTensor.from_dense(A, CSR)\n"
        "for f in (DIA, BSR(2, 2), DELTA(2), NM(2, 4)):\n"
        "    assert torch.equal(t.convert(f).to_dense(), A)\n"
        "TensorFormat.parse('(i, j) -> (j : dense, i : compressed)')\n"
        "st.SparseTensor(t.format, t.shape, t.pos_buffers, t.crd_buffers, t.values)\n"
    )
    got = _imported_after(code)
    assert got["imported"] == [], f"core operations pulled in {got['imported']}"
