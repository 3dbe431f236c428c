"""Merge bench_scaling.py launches into scaling tables (JSON) and a plot (PNG where matplotlib is
installed): weak-scaling efficiency per iteration ``t1 / tp`` (the same unknowns per rank) and
strong-scaling speed-up ``t_pmin / t_p`` at a fixed size, both from the slowest rank's seconds per
iteration of a converged solve.

    python benchmarks/scaling_report.py benchmarks/results/scaling/*.json --out benchmarks/results/scaling_h200.json
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("files", nargs="+")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    runs = [json.loads(Path(f).read_text()) | {"file": str(f)} for f in args.files]
    groups: dict[str, list[dict]] = defaultdict(list)
    for r in runs:
        groups[r["tag"]].append(r)
    tables = {}
    for tag, rs in sorted(groups.items()):
        rs.sort(key=lambda r: r["summary"]["ranks"])
        base = rs[0]["summary"]
        rows = []
        for r in rs:
            s = r["summary"]
            ratio = base["s_per_iteration"] / s["s_per_iteration"]
            rows.append(dict(ranks=s["ranks"], unknowns=s["unknowns"], iterations=s["iterations"], residual=s["residual"],
                             converged=s["converged"], s_per_iteration=s["s_per_iteration"], solve_s=s["solve_s"],
                             peak_gib_per_rank=max(s["peak_bytes_per_rank"]) / 2**30,
                             halo_bytes_per_product_max=s["halo_bytes_per_product_max"],
                             efficiency=ratio if r["mode"] == "weak" else ratio * base["ranks"] / s["ranks"],
                             speedup=None if r["mode"] == "weak" else ratio, file=r["file"]))
        tables[tag] = dict(mode=rs[0]["mode"], problem=rs[0]["problem"], machine=rs[-1]["machine"], rows=rows)
        print(f"{tag} ({rs[0]['mode']}):")
        for row in rows:
            print(f"  p={row['ranks']}: N={row['unknowns']:.3e} {row['iterations']} it, res {row['residual']:.1e}, "
                  f"{row['s_per_iteration'] * 1e3:.3f} ms/it, efficiency {row['efficiency']:.2f}, "
                  f"{row['peak_gib_per_rank']:.1f} GiB/rank")
    Path(args.out).write_text(json.dumps(dict(benchmark="scaling_report", tables=tables), indent=1))
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no plot")
        return
    fig, ax = plt.subplots(figsize=(6, 4))
    for tag, t in tables.items():
        ax.plot([r["ranks"] for r in t["rows"]], [r["efficiency"] for r in t["rows"]], "o-", label=f"{tag} ({t['mode']})")
    ax.axhline(0.8, color="grey", ls="--", lw=0.8)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("GPUs")
    ax.set_ylabel("efficiency per CG iteration")
    ax.set_ylim(0, 1.1)
    ax.legend(fontsize=8)
    fig.tight_layout()
    png = Path(args.out).with_suffix(".png")
    fig.savefig(png, dpi=120)
    print(f"wrote {args.out} and {png}")


if __name__ == "__main__":
    main()
