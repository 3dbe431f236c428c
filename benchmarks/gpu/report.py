"""Markdown tables and PNG plots of a GPU-suite result document (``suite.py`` writes both).

    python benchmarks/gpu/report.py benchmarks/results/gpu_suite.json   # re-render the .md and PNGs
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Callable

__all__ = ["markdown", "plots"]


def _us(s: Any) -> str:
    return "-" if s is None else f"{s * 1e6:,.1f}"


def _status(row: dict) -> str:
    if "error" in row:
        return "error: " + row["error"].splitlines()[0][:120]
    if "skipped" in row:
        return row["skipped"][:120]
    return ""


def _rows_table(c: dict, title: str, intro: Callable[[dict], list], header: list, has: str,
                lead: Callable[[dict], list], cells: Callable[[dict], list]) -> list:
    """A case's section: its title, the case's error or ``intro(c)`` and one table row per result
    (``lead`` cells, then ``cells`` where the row has ``has``, else dashes and its status)."""
    out = [f"## {title}", ""]
    if "error" in c:
        return out + [f"error: {c['error']}", ""]
    nlead = len(lead({"impl": "", "rhs": "", "case": ""}))
    out += intro(c) + ["| " + " | ".join(header) + " |",
                       "|" + "|".join("---" if i < nlead or h in _TEXT_COLUMNS else "---:" for i, h in enumerate(header)) + "|"]
    for r in c["rows"]:
        data = cells(r) if has in r else ["-"] * (len(header) - nlead - 1) + [_status(r)]
        out.append("| " + " | ".join(str(x) for x in [*lead(r), *data]) + " |")
    return out + [""]


#: data columns of text (left-aligned; the others are numbers)
_TEXT_COLUMNS = {"choice / note"}


def _opt(v: Any, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


def _pf(r: dict) -> str:
    return ("+" + r["preconditioner"]) if r.get("preconditioner") else ""


#: (case, title, intro, header, key of a measured row, leading cells, data cells) of the cases rendered row by row
_ROW_TABLES: list = [
    ("cg_1m", "CG, 2-D Poisson 1000² (1M unknowns, float64, ||r|| <= 1e-6 ||b||)", lambda c: [],
     ["rhs", "implementation", "seconds", "iterations", "true rel. residual", "choice / note"], "seconds",
     lambda r: [r.get("rhs", "-"), r["impl"]],
     lambda r: [f"{r['seconds']:.3f}", _opt(r["iterations"], ""), f"{r['residual']:.1e}", f"{r.get('choice', '')} {_pf(r)}"]),
    ("cg_64m", "CG at 64M unknowns (2-D Poisson 8000²): memory and time per iteration",
     lambda c: [f"{c['problem']['unknowns']:,} unknowns, {c['problem'].get('nnz', 0):,} nonzeros, "
                f"{c['problem']['iterations']} iterations.", ""],
     ["implementation", "peak GB", "inputs GB", "extra GB", "bytes/unknown (peak)", "extra bytes/unknown", "ms / iteration"],
     "peak_bytes", lambda r: [r["impl"]],
     lambda r: [f"{r['peak_bytes'] / 1e9:.2f}", f"{r['inputs_bytes'] / 1e9:.2f}", f"{r['extra_bytes'] / 1e9:.2f}",
                f"{r['bytes_per_unknown']:.0f}", f"{r['extra_bytes_per_unknown']:.0f}", f"{r['seconds_per_iteration'] * 1e3:.2f}"]),
    ("backward_1m", "Backward vs forward peak memory, 1000 CG iterations, 1M unknowns", lambda c: [],
     ["implementation", "forward peak MB", "graph held MB", "backward peak MB", "backward / forward", "forward s", "backward s"],
     "forward_peak_bytes", lambda r: [r["impl"]],
     lambda r: [f"{r['forward_peak_bytes'] / 1e6:.0f}", f"{r['graph_held_bytes'] / 1e6:.0f}", f"{r['backward_peak_bytes'] / 1e6:.0f}",
                f"{r['backward_over_forward']:.2f}", f"{r['forward_s']:.2f}", f"{r['backward_s']:.2f}"]),
    ("cuda_kernels", "Native kernels (cuda backend) beside torch, CuPy and dense cuBLAS",
     lambda c: ["Kernel time: 20 calls captured in a CUDA graph, replayed (median); cold: the same with the calls "
                "cycling through copies of the operands that hold three L2s (none finds its matrix in L2; the low-sparsity "
                "rows the plan runs by default and dense); call time: per-call CUDA events.", ""],
     ["case", "implementation", "kernel us", "cold us", "call us", "floor us", "fraction of floor", "rel. error"], "call_s",
     lambda r: [r.get("case", "-"), r["impl"]],
     lambda r: [_us(r["kernel_s"]) if r.get("kernel_s") else "-", _us(r["kernel_cold_s"]) if r.get("kernel_cold_s") else "-",
                _us(r["call_s"]), _us(r["floor_s"]), f"{r['fraction_of_floor']:.2f}", _opt(r.get("rel_err"), ".1e")]),
    ("cg_1g", "CG at 1.2e9 unknowns (cuda backend, DIA without index arrays)",
     lambda c: [f"{c['problem']['unknowns']:,} unknowns ({c['problem']['grid']}), {c['problem']['format']}, "
                f"{c['problem']['dtype']}, {c['problem']['iterations']} iterations.", ""],
     ["implementation", "ms / iteration", "floor ms", "time / floor", "peak GB", "extra bytes / unknown", "residual"],
     "ms_per_iteration", lambda r: [r["impl"]],
     lambda r: [f"{r['ms_per_iteration']:.1f}", _opt(r.get("floor_ms"), ".1f"), _opt(r.get("time_over_floor"), ".2f"),
                f"{r['peak_bytes'] / 1e9:.1f}", f"{r['extra_bytes_per_unknown']:.0f}",
                f"{r.get('true_residual', r.get('residual')):.6g}"]),
]


def markdown(doc: dict) -> str:
    v, mch = doc["versions"], doc["machine"]
    lines = [f"# GPU suite ({mch['gpu']}, {doc['date']})", "",
             f"Command: `{doc['command']}`", "",
             "Versions: " + ", ".join(f"{k} {val}" for k, val in v.items()), "",
             f"Copy bandwidth (read + write, measured in this run): {doc['copy_bandwidth']['bytes_per_s'] / 1e12:.2f} TB/s", ""]
    lines += [f"- {n}" for n in doc.get("notes", [])] + [""]
    cases = doc["cases"]
    if "spmv" in cases:
        c = cases["spmv"]
        lines += ["## SpMV, 3-D 7-point stencil", ""]
        if "error" in c:
            lines += [f"error: {c['error']}", ""]
        else:
            mt = c["matrix"]
            lines += [f"{mt['rows']:,} rows, {mt['nnz']:,} nonzeros ({mt['grid']}); median of {c['reps']} per-call CUDA-event "
                      f"timings (each call between its own two events: the host's event records count once the "
                      f"kernel is shorter than the host work) and, where measured, back to back: 100 calls between "
                      f"one pair of events, per call, median of 5 (a loop's throughput).", ""]
            for dt, res in c["results"].items():
                lines += [f"### {dt}: floor {_us(res['csr_int32_floor_s'])} us (CSR int32), {_us(res['dia_floor_s'])} us (DIA)", "",
                          "| implementation | format | median us | back to back us | own floor us | fraction of own floor "
                          "| fraction of CSR-int32 floor | rel. error | note |",
                          "|---|---|---:|---:|---:|---:|---:|---:|---|"]
                for r in res["rows"]:
                    if "median_s" in r:
                        note = r.get("choice") or ""
                        lines.append(f"| {r['impl']} | {r['format']} | {_us(r['median_s'])} | {_us(r.get('back_to_back_s'))} | "
                                     f"{_us(r['floor_s'])} | "
                                     f"{r['fraction_of_floor']:.2f} | {res['csr_int32_floor_s'] / r['median_s']:.2f} | "
                                     f"{r['rel_err']:.1e} | {note}{'' if r['correct'] else ' WRONG RESULT'} |")
                    else:
                        lines.append(f"| {r['impl']} | {r.get('format', '-')} | - | - | - | - | - | {_status(r)} |")
                lines.append("")
    if "direct_1m" in cases:
        c = cases["direct_1m"]
        lines += ["## Direct solve in a training loop, 2-D Poisson 1000² (SPD, float64)", ""]
        if "rows" not in c:
            lines += [f"{c.get('skipped') or c.get('error')}", ""]
        else:
            lines += [f"cuDSS {c['problem']['cudss']}; repeat = new values + solve, step = new values + solve + backward "
                      f"(median of {c['problem']['repeats']}).", "",
                      "| implementation | first call s | repeat ms | solve ms | backward ms | step ms | note |",
                      "|---|---:|---:|---:|---:|---:|---|"]

            def ms(r, k):
                return f"{r[k] * 1e3:.1f}" if isinstance(r.get(k), (int, float)) else "-"

            for r in c["rows"]:
                note = r.get("error") or r.get("choice") or ""
                if "cudss" in r and isinstance(r["cudss"], dict):
                    note = r["cudss"].get("error", note)
                solve_key = "solve_only_s" if "solve_only_s" in r else "repeat_solve_s"
                first = f"{r['first_s']:.2f}" if isinstance(r.get("first_s"), (int, float)) else "-"
                lines.append(f"| {r['impl']} | {first} | {ms(r, 'repeat_s')} | {ms(r, solve_key)} | {ms(r, 'backward_s')} | "
                             f"{ms(r, 'step_s')} | {str(note)[:120]} |")
            lines.append("")
    if "loop_1m" in cases:
        c = cases["loop_1m"]
        lines += ["## A training loop of one-shot solves on one pattern, 2-D Poisson 1000² (SPD, float64)", ""]
        if "rows" not in c:
            lines += [f"{c.get('skipped') or c.get('error')}", ""]
        else:
            p = c["problem"]
            lines += [f"{p['steps']} steps, new values each step, one `st.solve` per step; cuDSS: {p['cudss']}.", "",
                      "| implementation | total s | first step | last step | switched at step | median step ms (last half) |",
                      "|---|---:|---|---|---|---:|"]
            for r in c["rows"]:
                if "total_s" in r:
                    half = sorted(r["step_s"][len(r["step_s"]) // 2:])
                    med = half[len(half) // 2] * 1e3 if half else float("nan")
                    sw = ", ".join(str(k + 1) for k in r["switch_steps"]) or "-"
                    lines.append(f"| {r['impl']} | {r['total_s']:.2f} | {r['used'][0]} | {r['used'][-1]} | {sw} | {med:.1f} |")
                else:
                    lines.append(f"| {r['impl']} | - | - | - | - | {_status(r)} |")
            lines.append("")
    for name, title, intro, header, has, lead, cells in _ROW_TABLES:
        if name in cases:
            lines += _rows_table(cases[name], title, intro, header, has, lead, cells)
    lines.append(f"Suite wall time: {doc.get('wall_seconds', 0):.0f} s.")
    return "\n".join(lines) + "\n"


def plots(doc: dict, out_dir: Path) -> list[Path]:
    """PNG bar charts (SpMV times with the floors; CG seconds); [] when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    written = []
    spmv = doc["cases"].get("spmv", {})
    if "results" in spmv:
        res = spmv["results"]
        fig, axes = plt.subplots(1, len(res), figsize=(9 * len(res), 9), squeeze=False)
        for ax, (dt, r) in zip(axes[0], res.items()):
            rows = [x for x in r["rows"] if "median_s" in x]
            names = [x["impl"] for x in rows]
            families = "sparsetorch torch cupy nvmath dense".split()
            ax.barh(range(len(rows)), [x["median_s"] * 1e6 for x in rows],
                    color=[f"C{families.index(x['family'])}" for x in rows])
            ax.axvline(r["csr_int32_floor_s"] * 1e6, color="k", ls="--", label="CSR int32 bytes floor")
            ax.axvline(r["dia_floor_s"] * 1e6, color="gray", ls=":", label="DIA bytes floor")
            ax.set_yticks(range(len(rows)), names, fontsize=7)
            ax.set_xscale("log")
            ax.set_xlabel("median time per SpMV (us, log)")
            ax.set_title(f"SpMV {spmv['matrix']['grid']} stencil, {dt}")
            ax.invert_yaxis()
            ax.legend(fontsize=8)
        fig.tight_layout()
        p = out_dir / "gpu_spmv.png"
        fig.savefig(p, dpi=110)
        plt.close(fig)
        written.append(p)
    cgc = doc["cases"].get("cg_1m", {})
    if "rows" in cgc:
        rows = [x for x in cgc["rows"] if "seconds" in x]
        fig, ax = plt.subplots(figsize=(9, 5))
        labels = [f"{x['impl']} ({x['rhs']})" for x in rows]
        ax.barh(range(len(rows)), [x["seconds"] for x in rows], color=["C0" if x["rhs"] == "random" else "C1" for x in rows])
        ax.set_yticks(range(len(rows)), labels, fontsize=7)
        ax.invert_yaxis()
        ax.set_xlabel("seconds to ||r|| <= 1e-6 ||b||")
        ax.set_title("CG, 2-D Poisson 1000^2 (1M unknowns, float64)")
        fig.tight_layout()
        p = out_dir / "gpu_cg.png"
        fig.savefig(p, dpi=110)
        plt.close(fig)
        written.append(p)
    return written


if __name__ == "__main__":
    path = Path(sys.argv[1])
    doc = json.loads(path.read_text())
    path.with_suffix(".md").write_text(markdown(doc))
    print(plots(doc, path.parent))
