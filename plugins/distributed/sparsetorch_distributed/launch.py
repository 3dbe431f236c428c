"""Run a function on N local processes over gloo (tests, benchmarks, notebooks without torchrun).

``run_local(n, "package.module:function", args, timeout=120)`` starts ``n`` Python processes, each
initializing the default process group on a free port of 127.0.0.1 (gloo, 60 s collective
timeout), calls ``function(comm, *args)`` and returns the list of per-rank results (pickled through
files). A process that fails or a run past ``timeout`` raises :class:`LaunchError` with every
rank's stderr tail; processes still alive then are killed (by their own process ids).
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .comm import free_port

__all__ = ["run_local", "LaunchError"]


class LaunchError(RuntimeError):
    """A locally launched distributed run failed or timed out."""


def run_local(nprocs: int, target: str, args: tuple = (), *, timeout: float = 120.0, env: dict | None = None,
              backend: str = "gloo", collective_timeout: float = 60.0) -> list:
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="sparsetorch-dist-") as tmp:
        tmpd = Path(tmp)
        (tmpd / "args.pkl").write_bytes(pickle.dumps((target, args)))
        procs = []
        for rank in range(nprocs):
            e = dict(os.environ)
            e.update(env or {})
            e.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(rank),
                      "WORLD_SIZE": str(nprocs), "LOCAL_RANK": str(rank), "OMP_NUM_THREADS": e.get("OMP_NUM_THREADS", "1"),
                      "OPENBLAS_NUM_THREADS": e.get("OPENBLAS_NUM_THREADS", "1")})
            err = open(tmpd / f"err{rank}.txt", "w")
            procs.append((subprocess.Popen([sys.executable, "-m", "sparsetorch_distributed.launch", str(tmpd), backend,
                                            str(collective_timeout)], env=e, stdout=err, stderr=subprocess.STDOUT), err))
        deadline = time.monotonic() + timeout
        failed = None
        try:
            while any(p.poll() is None for p, _ in procs):
                if time.monotonic() > deadline:
                    failed = f"timed out after {timeout:.0f} s"
                    break
                bad = [i for i, (p, _) in enumerate(procs) if p.poll() not in (None, 0)]
                if bad and failed is None:
                    # give the others a moment to fail on their own (they should: agreed errors)
                    grace = time.monotonic() + min(30.0, max(0.0, deadline - time.monotonic()))
                    while any(p.poll() is None for p, _ in procs) and time.monotonic() < grace:
                        time.sleep(0.05)
                    failed = f"rank(s) {bad} exited with an error"
                    break
                time.sleep(0.02)
        finally:
            for p, f in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
                f.close()
        codes = [p.returncode for p, _ in procs]
        if failed or any(c != 0 for c in codes):
            tails = "\n".join(f"--- rank {r} (exit {codes[r]}) ---\n" + (tmpd / f"err{r}.txt").read_text()[-3000:]
                              for r in range(nprocs))
            raise LaunchError(f"{failed or 'a rank failed'}; exit codes {codes}\n{tails}")
        return [pickle.loads((tmpd / f"out{r}.pkl").read_bytes()) for r in range(nprocs)]


def _main(argv: list[str]) -> int:
    import datetime
    import importlib

    import torch.distributed as dist

    from .comm import Comm

    tmpd, backend, ctimeout = Path(argv[0]), argv[1], float(argv[2])
    target, args = pickle.loads((tmpd / "args.pkl").read_bytes())
    mod, fn = target.split(":")
    func = getattr(importlib.import_module(mod), fn)
    dist.init_process_group(backend=backend, timeout=datetime.timedelta(seconds=ctimeout))
    try:
        result = func(Comm(timeout=datetime.timedelta(seconds=ctimeout)), *args)
        rank = dist.get_rank()
        (tmpd / f"out{rank}.pkl").write_bytes(pickle.dumps(result))
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
