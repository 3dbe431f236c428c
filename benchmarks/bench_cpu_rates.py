"""Do the CPU cost estimates rank methods right? Built-in rates against measured rates.

For 2-D Poisson 64² and 256² (SPD, float64, one thread): the top offers of ``explain`` under
``SPARSETORCH_CALIBRATION=defaults`` and ``=measure``, each run once from a cold plan ("first")
and once with new values on the kept plan ("new values"), with the estimate next to the times.
The chosen method and the fastest one are recorded per mode. This is the evidence behind CPUs
using the built-in rates by default (docs/dispatch.md, "Cost models").

    python benchmarks/bench_cpu_rates.py        # writes benchmarks/results/cpu_rates.json
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

_CHILD = r'''
import json, sys, time, torch, sparsetorch as st
from sparsetorch.testing.problems import poisson2d
torch.set_num_threads(1)
out = {}
for m in (64, 256):
    A = poisson2d(m); b = torch.ones(A.shape[0], dtype=torch.float64)
    t = st.explain("solve", A, b, properties="spd")
    rows = []
    for r in [r for r in t.rows if r.seconds is not None][:6]:
        kw = {"preconditioner": r.offer.preconditioner} if r.offer.preconditioner else {}
        st.plan_cache().clear()
        t0 = time.perf_counter(); st.solve(A, b, backend=r.backend, method=r.method, properties="spd", **kw)
        first = time.perf_counter() - t0
        t0 = time.perf_counter(); st.solve(A.with_values(A.values * 1.01), b, backend=r.backend, method=r.method, properties="spd", **kw)
        again = time.perf_counter() - t0
        rows.append({"backend": r.backend, "method": r.method, "preconditioner": r.offer.preconditioner,
                     "estimate_s": r.seconds, "first_s": first, "new_values_s": again})
    fastest = min(rows, key=lambda x: x["new_values_s"])
    out[f"poisson2d {m}^2"] = {"chosen": f"{t.chosen.backend}/{t.chosen.method}", "rows": rows,
                               "fastest (new values)": f"{fastest['backend']}/{fastest['method']}",
                               "chosen over fastest (new values)": rows[0]["new_values_s"] / fastest["new_values_s"]}
print(json.dumps(out))
'''


def main() -> None:
    doc = {"benchmark": "CPU cost estimates vs measured times, built-in vs measured rates",
           "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
           "command": "python benchmarks/bench_cpu_rates.py",
           "machine": {"platform": platform.platform(), "cpu_count": os.cpu_count(), "threads": 1},
           "modes": {}}
    for mode in ("defaults", "measure"):
        env = {**os.environ, "SPARSETORCH_CALIBRATION": mode, "OPENBLAS_NUM_THREADS": "1"}
        res = subprocess.run([sys.executable, "-c", _CHILD], capture_output=True, text=True, env=env, check=True)
        doc["modes"][mode] = json.loads(res.stdout.strip().splitlines()[-1])
        for case, c in doc["modes"][mode].items():
            print(f"{mode:9s} {case:16s} chosen {c['chosen']:16s} fastest {c['fastest (new values)']:16s} "
                  f"chosen/fastest {c['chosen over fastest (new values)']:.2f}")
    import torch

    import sparsetorch

    doc["versions"] = {"python": platform.python_version(), "torch": torch.__version__, "sparsetorch": sparsetorch.__version__}
    out = HERE / "results" / "cpu_rates.json"
    out.write_text(json.dumps(doc, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
