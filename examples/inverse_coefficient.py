"""Inverse coefficient problem: recover a conductivity field from the solution of a PDE.

The problem is the one torch-sla benchmarks (``benchmarks/ops/benchmark_inverse_coefficient.py``
in sparsexlab/torch-sla), set up the same way:

- ``-div(kappa grad u) = 1`` on the unit square, ``u = 0`` on the boundary, on an ``n x n`` grid
  of nodes ``x_j = j h``, ``h = 1 / (n - 1)``; the unknowns are the ``(n - 2)^2`` interior nodes
  (``n = 64``: 62^2 = 3,844 unknowns), the boundary nodes are eliminated (Dirichlet zero);
- a 5-point stencil whose face conductivities are the arithmetic mean of the two nodal
  ``kappa`` values it joins, so ``A(kappa)`` is symmetric positive definite;
- the truth ``kappa* = 1 + 0.5 sin(2 pi x) sin(2 pi y)`` on all ``n^2`` nodes; observations
  ``u_obs = A(kappa*)^-1 f`` at every unknown, ``f = 1``;
- the unknown ``kappa = softplus(theta)``, ``theta`` initialised so that ``kappa = 1``;
- the loss ``sum (u - u_obs)^2 + reg * (sum of squared first differences of kappa) / n^2`` with
  ``reg = 1e-4``, minimised by Adam with ``lr = 0.05``;
- the metric: the relative L2 error of ``kappa`` over the ``n x n`` grid.

What sparsetorch does differently is the solve. The sparsity pattern never changes, so the
matrix is built once as a pattern (CSR) and each step only supplies new differentiable values
(``SparseTensor.with_values``); a :class:`sparsetorch.Solver` plans once, refactorizes on the
new values, solves, and its backward pass is one transposed solve on the same factorization.

Run it (after the README's quick start)::

    python examples/inverse_coefficient.py                  # CPU, until 0.23 % or 4000 steps
    python examples/inverse_coefficient.py --device cuda    # on a GPU
    python examples/inverse_coefficient.py --n 32 --steps 200 --target 0

``benchmarks/bench_inverse.py`` runs it side by side with torch-sla and records the timings.
"""

from __future__ import annotations

import argparse
import math
import time
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.nn.functional as F

import sparsetorch as st
from sparsetorch.format import CSR

__all__ = [
    "Grid", "make_grid", "kappa_star", "stencil_coefficients", "assemble_values", "smoothness", "relative_l2",
    "theta_for_kappa", "default_solver", "InverseProblem", "run", "main",
]


@dataclass
class Grid:
    """The pattern of ``A(kappa)`` on an ``n x n`` node grid, built once.

    ``A`` is a CSR ``SparseTensor`` holding the pattern (its values are placeholders); the
    stencil values arrive per step through ``A.with_values``. ``slots`` names, for each stored
    entry of ``A`` in CSR order, the stencil coefficient it holds, as an index into the
    concatenation ``[diagonal (m^2), east-west couplings (m (m-1)), north-south couplings (m (m-1))]``
    produced by :func:`stencil_coefficients`.
    """

    n: int
    h: float
    A: st.SparseTensor
    slots: torch.Tensor
    f: torch.Tensor
    #: the same stencil as COO triplets (row, column, coefficient index), before the CSR build
    coo: tuple[torch.Tensor, torch.Tensor, torch.Tensor]

    @property
    def m(self) -> int:
        return self.n - 2

    @property
    def unknowns(self) -> int:
        return self.m * self.m


def make_grid(n: int = 64, *, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float64) -> Grid:
    """Pattern work, once: the coordinates of the 5-point stencil on the interior nodes, and the
    map from stencil coefficients to CSR slots (no Python loop over entries)."""
    if n < 4:
        raise ValueError(f"the grid needs at least 4 nodes per side (2 interior), got n={n}")
    device = torch.device(device)
    m = n - 2
    ids = torch.arange(m * m, device=device).reshape(m, m)  # unknown number of interior node (i, j)
    diag = ids.reshape(-1)
    west, east = ids[:, :-1].reshape(-1), ids[:, 1:].reshape(-1)    # horizontal neighbours
    north, south = ids[:-1, :].reshape(-1), ids[1:, :].reshape(-1)  # vertical neighbours
    rows = torch.cat([diag, west, east, north, south])
    cols = torch.cat([diag, east, west, south, north])
    nd, nh = diag.numel(), west.numel()
    # Coefficient index of every COO entry: the diagonal, then each coupling twice (symmetric).
    coeff = torch.cat([
        torch.arange(nd, device=device),
        torch.arange(nd, nd + nh, device=device).repeat(2),
        torch.arange(nd + nh, nd + 2 * nh, device=device).repeat(2),
    ])
    # Carry the coefficient index through the COO -> CSR construction as the values (exact in
    # float64 far beyond this size): the CSR values then name each slot's coefficient.
    P = st.SparseTensor.from_coo(coeff.to(torch.float64), rows, cols, shape=(m * m, m * m), format=CSR)
    slots = P.values.round().to(torch.int64)
    A = P.with_values(torch.zeros(P.values.shape, dtype=dtype, device=device))
    f = torch.ones(m * m, dtype=dtype, device=device)
    return Grid(n=n, h=1.0 / (n - 1), A=A, slots=slots, f=f, coo=(rows, cols, coeff))


def kappa_star(n: int, *, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """The true conductivity ``1 + 0.5 sin(2 pi x) sin(2 pi y)`` on the ``n x n`` nodes (row = y)."""
    t = torch.linspace(0.0, 1.0, n, device=device, dtype=dtype)
    s = torch.sin(2 * math.pi * t)
    return 1.0 + 0.5 * s[:, None] * s[None, :]


def stencil_coefficients(kappa: torch.Tensor, h: float) -> torch.Tensor:
    """``[diagonal, east-west, north-south]`` coefficients of ``A(kappa)`` (differentiable).

    Face conductivities are arithmetic means of the nodal values; the faces between an interior
    node and a boundary node enter the diagonal only (Dirichlet ``u = 0``)."""
    inv_h2 = 1.0 / (h * h)
    # Faces of the interior nodes: horizontal faces between columns j and j+1, rows 1..n-2;
    # vertical faces between rows i and i+1, columns 1..n-2.
    fx = 0.5 * (kappa[1:-1, :-1] + kappa[1:-1, 1:])  # (m, n-1): face k joins columns k and k+1
    fy = 0.5 * (kappa[:-1, 1:-1] + kappa[1:, 1:-1])  # (n-1, m): face k joins rows k and k+1
    diag = (fx[:, :-1] + fx[:, 1:] + fy[:-1, :] + fy[1:, :]) * inv_h2  # (m, m)
    ew = -fx[:, 1:-1] * inv_h2  # (m, m-1): between interior columns
    ns = -fy[1:-1, :] * inv_h2  # (m-1, m): between interior rows
    return torch.cat([diag.reshape(-1), ew.reshape(-1), ns.reshape(-1)])


def assemble_values(grid: Grid, kappa: torch.Tensor) -> torch.Tensor:
    """``A(kappa)``'s values in the CSR slots of ``grid.A`` (differentiable in ``kappa``)."""
    return stencil_coefficients(kappa, grid.h)[grid.slots]


def smoothness(kappa: torch.Tensor) -> torch.Tensor:
    """Mean squared first differences: ``(sum dx^2 + sum dy^2) / n^2``."""
    dx = kappa[:, 1:] - kappa[:, :-1]
    dy = kappa[1:, :] - kappa[:-1, :]
    return (dx.square().sum() + dy.square().sum()) / kappa.numel()


def relative_l2(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(torch.linalg.vector_norm(a - b) / torch.linalg.vector_norm(b))


def default_solver(device: str | torch.device) -> dict:
    """The solver options the example uses when none are given: the SciPy plugin's SuperLU
    (``backend="scipy", method="lu"``) with a panel size of 4 on the CPU, the cheapest capable
    backend elsewhere.

    On the CPU the SciPy plugin's SuperLU is pinned: the gradient needs accurate solves, a direct
    factorization gives them at every step, and the plan keeps the fill-reducing ordering from
    one step to the next (the cost model ranks Jacobi-CG first for this size, which is slower
    here at the tolerance the inverse problem needs). A panel of 4 columns factors this 2-D
    grid about 20 % faster than SuperLU's default (measured; 3-D problems prefer the default).
    With the Eigen plugin installed its Cholesky (analysis once, numeric factorization per step)
    is used instead: 3.9 ms per step against SuperLU's 6.4 (benchmarks/results/inverse_cpu.json).
    Elsewhere dispatch chooses; ``rtol`` then bounds an iterative method's error."""
    if torch.device(device).type == "cpu":
        if "eigen" in st.registry().names:
            return {"backend": "eigen", "method": "cholesky"}
        return {"backend": "scipy", "method": "lu", "backend_options": {"panel_size": 4}}
    return {}


def theta_for_kappa(kappa: float) -> float:
    """``theta`` with ``softplus(theta) = kappa``."""
    return math.log(math.expm1(kappa))


@dataclass
class InverseProblem:
    """Everything one optimisation needs; :meth:`step` is one Adam step, split into the stages
    the benchmark times (:meth:`assemble`, :meth:`refactorize`, :meth:`forward`, :meth:`backward`,
    :meth:`update`)."""

    grid: Grid
    kappa_true: torch.Tensor
    u_obs: torch.Tensor
    theta: torch.Tensor
    optimizer: torch.optim.Optimizer
    solver: st.Solver
    reg: float = 1e-4
    # per-step scratch
    _kappa: torch.Tensor | None = field(default=None, repr=False)
    _values: torch.Tensor | None = field(default=None, repr=False)
    _loss: torch.Tensor | None = field(default=None, repr=False)

    @classmethod
    def build(
        cls, n: int = 64, *, lr: float = 0.05, reg: float = 1e-4, device: str | torch.device = "cpu",
        dtype: torch.dtype = torch.float64, backend: str | None = None, method: str | None = None,
        **solver_options,
    ) -> "InverseProblem":
        grid = make_grid(n, device=device, dtype=dtype)
        truth = kappa_star(n, device=device, dtype=dtype)
        # The Laplacian-like A(kappa) is SPD for kappa > 0; saying so skips detection.
        solver = st.Solver(grid.A, properties="spd", backend=backend, method=method, **solver_options)
        with torch.no_grad():
            solver.update_values(assemble_values(grid, truth))
            u_obs = solver.solve(grid.f)
        theta = torch.full((n, n), theta_for_kappa(1.0), device=device, dtype=dtype, requires_grad=True)
        opt = torch.optim.Adam([theta], lr=lr)
        return cls(grid, truth, u_obs, theta, opt, solver, reg)

    # The stages of one step ------------------------------------------------------------------
    def assemble(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        self._kappa = F.softplus(self.theta)
        self._values = assemble_values(self.grid, self._kappa)

    def refactorize(self) -> None:
        self.solver.update_values(self._values)  # numeric factorization only; the plan is kept

    def forward(self) -> torch.Tensor:
        u = self.solver.solve(self.grid.f)
        data = (u - self.u_obs).square().sum()
        self._loss = data + self.reg * smoothness(self._kappa) if self.reg > 0 else data
        return self._loss

    def backward(self) -> None:
        self._loss.backward()  # one transposed solve on the same factorization

    def update(self) -> float:
        """The Adam update; returns the relative error of kappa after it."""
        self.optimizer.step()
        with torch.no_grad():
            return relative_l2(F.softplus(self.theta), self.kappa_true)

    def step(self) -> tuple[float, float]:
        """One Adam step: ``(loss before the update, kappa error after it)``."""
        self.assemble()
        self.refactorize()
        loss = self.forward()
        self.backward()
        err = self.update()
        return float(loss.detach()), err

    def loss_at(self, theta: torch.Tensor) -> torch.Tensor:
        """The loss as a function of ``theta`` (for gradient checks), sharing the solver."""
        kappa = F.softplus(theta)
        self.solver.update_values(assemble_values(self.grid, kappa))
        u = self.solver.solve(self.grid.f)
        return (u - self.u_obs).square().sum() + self.reg * smoothness(kappa)

    def kappa(self) -> torch.Tensor:
        return F.softplus(self.theta.detach())


def run(
    n: int = 64, *, steps: int = 4000, target: float = 2.3e-3, lr: float = 0.05, reg: float = 1e-4,
    device: str = "cpu", dtype: torch.dtype = torch.float64, solver: dict | None = None, rtol: float = 1e-10,
    log: Callable[[str], None] | None = print, log_every: int = 100,
) -> dict:
    """Optimise until the kappa error reaches ``target`` (0 disables) or ``steps`` steps; returns a record.

    ``solver``: options for :class:`sparsetorch.Solver` (``backend``, ``method``, ...), default
    :func:`default_solver`; ``rtol`` applies if an iterative method is chosen."""
    solver = default_solver(device) if solver is None else solver
    t0 = time.perf_counter()
    prob = InverseProblem.build(n, lr=lr, reg=reg, device=device, dtype=dtype, **{"rtol": rtol, **solver})
    setup = time.perf_counter() - t0
    losses, errors, reached = [], [], None
    t1 = time.perf_counter()
    for k in range(steps):
        loss, err = prob.step()
        losses.append(loss)
        errors.append(err)
        if log is not None and (k % log_every == 0 or k == steps - 1):
            log(f"  step {k + 1:5d}  loss={loss:.4e}  kappa_rel_err={err:.4e}")
        if target > 0 and err <= target:
            reached = k + 1
            break
    train = time.perf_counter() - t1
    return {
        "n": n, "unknowns": prob.grid.unknowns, "device": str(device), "backend": prob.solver.backend,
        "method": prob.solver.method, "steps": len(errors), "steps_to_target": reached, "target": target,
        "final_kappa_rel_err": errors[-1] if errors else None, "setup_seconds": setup, "train_seconds": train,
        "end_to_end_seconds": setup + train, "ms_per_step": 1e3 * train / max(len(errors), 1),
        "losses": losses, "errors": errors,
    }


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=64, help="nodes per side; (n-2)^2 unknowns (default 64)")
    p.add_argument("--steps", type=int, default=4000, help="at most this many Adam steps (default 4000)")
    p.add_argument("--target", type=float, default=2.3e-3, help="stop at this relative kappa error; 0: never (default 0.23 %%)")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--reg", type=float, default=1e-4)
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float64", choices=["float64", "float32"])
    p.add_argument("--backend", default=None, help="pin a sparsetorch backend (default: chosen by cost)")
    p.add_argument("--method", default=None,
                   help="pin a method (lu, cholesky, cg, ...); default on the CPU: the Eigen plugin's cholesky if installed, "
                        "else SciPy's lu (panel size 4); chosen by cost elsewhere")
    p.add_argument("--rtol", type=float, default=1e-10, help="tolerance if an iterative method runs (default 1e-10)")
    args = p.parse_args(argv)
    torch.manual_seed(0)
    dtype = getattr(torch, args.dtype)
    print(f"[setup] n={args.n} unknowns={(args.n - 2) ** 2} device={args.device} dtype={args.dtype}", flush=True)
    rec = run(args.n, steps=args.steps, target=args.target, lr=args.lr, reg=args.reg, device=args.device, dtype=dtype,
              solver=_solver_from_args(args), rtol=args.rtol)
    hit = f"reached {rec['target']:.2%} at step {rec['steps_to_target']}" if rec["steps_to_target"] else "target not reached"
    print(f"[done] {rec['backend']}/{rec['method']}: {hit}; {rec['steps']} steps, final kappa error "
          f"{rec['final_kappa_rel_err']:.4e}, {rec['ms_per_step']:.2f} ms/step, {rec['end_to_end_seconds']:.2f} s end to end",
          flush=True)
    return rec


def _solver_from_args(args: argparse.Namespace) -> dict:
    if args.backend is None and args.method is None:
        return default_solver(args.device)
    return {"backend": args.backend, "method": args.method}


if __name__ == "__main__":
    main()
