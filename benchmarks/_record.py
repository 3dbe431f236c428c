"""What a CPU benchmark's JSON records besides its rows: the command that made it (with the thread settings of the
environment), the machine and the versions; and writing it. Shared by the scripts of this folder that import it
(run as ``python benchmarks/<script>.py``, which puts this folder on ``sys.path``)."""

from __future__ import annotations

import json
import os
import platform
import sys
from pathlib import Path
from typing import Any

import numpy as np
import scipy
import torch

import sparsetorch as st


def header(script: str, argv: list[str] | None) -> dict[str, Any]:
    """``command``, ``machine`` and ``versions`` for a run of ``benchmarks/<script>`` with ``argv`` (None: this
    process's arguments)."""
    env = " ".join(f"{k}={os.environ[k]}" for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS") if k in os.environ)
    args = " ".join(sys.argv[1:] if argv is None else argv)
    return {"command": f"{env + ' ' if env else ''}python benchmarks/{script} {args}".strip(),
            "machine": {"platform": platform.platform(), "python": platform.python_version(), "cpu_count": os.cpu_count(),
                        "torch_threads": torch.get_num_threads()},
            "versions": {"torch": torch.__version__, "numpy": np.__version__, "scipy": scipy.__version__,
                         "sparsetorch": st.__version__, "backends": sorted(st.registry().names)}}


def write(path: str, record: dict[str, Any]) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(record, indent=1))
    print("wrote", path)
