"""Command line interface: ``sparsetorch info | demo | bench``.

Kept import-light on purpose: only the standard library is imported at module
level. torch is imported inside ``info`` (it is a hard dependency and is needed
to report CUDA); optional packages are *never* imported here, only looked up
through ``importlib.metadata``.
"""

from __future__ import annotations

import argparse
import platform
import sys
from importlib import metadata
from pathlib import Path

# Optional packages reported by ``info``: (label, distribution names to try).
# Looked up by distribution metadata only, so nothing is imported.
_OPTIONAL_DISTRIBUTIONS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("scipy", ("scipy",)),
    ("pyamg", ("pyamg",)),
    ("cupy", ("cupy", "cupy-cuda13x", "cupy-cuda12x", "cupy-cuda11x", "cupy-rocm-5-0")),
    ("nvmath-python", ("nvmath-python",)),
    ("torch-sla", ("torch-sla",)),
)


def _dist_version(names: tuple[str, ...]) -> str | None:
    """Version of the first installed distribution among ``names``, else None."""
    for name in names:
        try:
            version = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
        return version if name == names[0] else f"{version} ({name})"
    return None


def _sparsetorch_version() -> str:
    import sparsetorch

    version = getattr(sparsetorch, "__version__", None)
    if version is None:  # package root not re-exporting it (yet)
        from sparsetorch._version import __version__ as version
    return str(version)


def _backend_lines() -> list[str]:
    """Lines describing the backends: each loaded one (name, version, distribution, devices,
    dtypes, ops and their methods, missing optional dependencies) and each broken plugin with
    its error. Loading the backends imports sparsetorch and the plugins' modules (which must not
    import their optional dependencies to answer); it never raises here.
    """
    import os

    try:
        from sparsetorch.dispatch.select import get_backends

        backends = get_backends()
        infos = backends.info()
        owners = backends.conversion_kernel_owners()
    except Exception as exc:  # noqa: BLE001 - `info` must print whatever else it knows
        return [f"backend discovery failed: {type(exc).__name__}: {exc}"]
    lines: list[str] = []
    for info in infos:
        source = info.distribution or "registered at run time"
        lines.append(f"{info.name:<12}{info.version:<10}({source}) devices: {', '.join(info.devices)}; "
                     f"dtypes: {', '.join(str(d).replace('torch.', '') for d in info.dtypes)}")
        ops = "; ".join(f"{op}: {', '.join(methods) or '-'}" for op, methods in info.ops.items())
        lines.append(f"{'':12}ops: {ops or 'none'}")
        steps = sorted(k for k, owner in owners.items() if owner == info.name)
        if steps:
            lines.append(f"{'':12}conversion kernels: {', '.join(steps)}")
        for dep, why in info.missing.items():
            lines.append(f"{'':12}missing {dep}: {why}")
    for broken in backends.broken:
        source = broken.distribution or "registered at run time"
        lines.append(f"{broken.name:<12}BROKEN ({source}): {broken.error}")
    for var in ("SPARSETORCH_DISABLE_PLUGINS", "SPARSETORCH_PLUGINS"):
        value = os.environ.get(var, "").strip()
        if value:
            lines.append(f"(external plugins filtered by {var}={value})")
    return lines


def _info_lines() -> list[str]:
    lines = [
        f"sparsetorch   {_sparsetorch_version()}",
        f"python        {platform.python_version()} ({sys.executable})",
        f"platform      {platform.platform()}",
    ]
    try:
        import torch
    except ImportError as exc:  # pragma: no cover - torch is a hard dependency
        lines.append(f"torch         NOT IMPORTABLE: {exc}")
    else:
        lines.append(f"torch         {torch.__version__}")
        if torch.cuda.is_available():
            count = torch.cuda.device_count()
            names = ", ".join(torch.cuda.get_device_name(i) for i in range(count))
            lines.append(f"cuda          available: {count} device(s): {names}")
        else:
            lines.append("cuda          not available")
    lines.append(f"numpy         {_dist_version(('numpy',)) or 'not installed'}")
    lines.append("optional packages:")
    for label, names in _OPTIONAL_DISTRIBUTIONS:
        version = _dist_version(names)
        lines.append(f"  {label:<14}{version if version else 'not installed'}")
    backends = _backend_lines()
    lines.append("backends:")
    if backends:
        lines.extend(f"  {line}" for line in backends)
    else:
        lines.append("  (backend discovery not available yet)")
    return lines


def _cmd_info(args: argparse.Namespace) -> int:
    print("\n".join(_info_lines()))
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    from sparsetorch import demo  # lazy: the demo pulls in the library

    result = demo.run(args)
    return int(result) if result is not None else 0


def _benchmarks_dir() -> Path | None:
    # core/sparsetorch/cli.py -> repository root is two levels above the package.
    candidates = (Path(__file__).resolve().parents[2] / "benchmarks", Path.cwd() / "benchmarks")
    for candidate in candidates:
        if candidate.is_dir():
            return candidate
    return None


def _cmd_bench(args: argparse.Namespace) -> int:
    print("Benchmarks live in benchmarks/ of the source repository (results in benchmarks/results/).")
    bench_dir = _benchmarks_dir()
    if bench_dir is None:
        print("No benchmarks/ directory found (run from a source checkout).")
        return 0
    scripts = sorted(p.name for p in bench_dir.glob("*.py") if p.name != "__init__.py")
    print(f"{bench_dir}:")
    if not scripts:
        print("  (no benchmark scripts yet)")
    for name in scripts:
        print(f"  {name}")
    if scripts:
        print(f"Run one with: python {bench_dir.name}/<script>.py")
    return 0


def _cmd_calibrate(args: argparse.Namespace) -> int:
    """Measure the cost-model rates of a device now and store them in the on-disk cache."""
    from sparsetorch.dispatch.calibrate import cache_path, calibrate

    r = calibrate(args.device)
    print(f"{args.device}: bandwidth {r.bandwidth / 1e9:.1f} GB/s, dense flops {r.flops / 1e9:.1f} GFLOP/s, "
          f"launch overhead {r.launch * 1e6:.1f} us")
    print(f"stored in {cache_path()}")
    if _device_type(args.device) == "cpu":
        print("CPU dispatch uses these only with SPARSETORCH_CALIBRATION=measure: the CPU cost models were "
              "fitted against the built-in rates (docs/dispatch.md)")
    return 0


def _device_type(device: str) -> str:
    return str(device).split(":")[0]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sparsetorch", description="sparsetorch: PyTorch sparse linear algebra."
    )
    sub = parser.add_subparsers(dest="command", metavar="{info,demo,bench,calibrate}")
    sub.required = True
    p_info = sub.add_parser("info", help="versions, devices, optional packages, backends")
    p_info.set_defaults(func=_cmd_info)
    p_demo = sub.add_parser("demo", help="run a short end-to-end demonstration")
    p_demo.set_defaults(func=_cmd_demo)
    p_bench = sub.add_parser("bench", help="list the benchmark scripts")
    p_bench.set_defaults(func=_cmd_bench)
    p_cal = sub.add_parser("calibrate", help="re-measure the cost-model rates of a device")
    p_cal.add_argument("--device", default="cpu", help="cpu (default), cuda, cuda:1, ...")
    p_cal.set_defaults(func=_cmd_calibrate)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``sparsetorch`` console script; returns the exit code."""
    args = _parser().parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
