"""The plugin machinery: registration, selection and its tie-break, broken plugins, the entry point.

In-process tests register small backend objects with ``get_backends().register(obj, name)`` and
reset the process-wide backends afterwards. The entry-point tests install
``examples/plugin_template`` into a temporary directory with pip (offline, no build isolation)
and run subprocesses with that directory on ``PYTHONPATH``, so the backend is found exactly as
an installed third-party distribution would be.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import sparsetorch
from sparsetorch import BackendInfo, Decline, Offer
from sparsetorch.dispatch import get_backends, reset_backends

ROOT = Path(__file__).resolve().parents[1]
CORE = ROOT / "core"
TEMPLATE = ROOT / "examples" / "plugin_template"


# Test doubles -------------------------------------------------------------------------------------
class DensePlan:
    """A correct solve plan (dense LU through torch) so a test backend's answers can be checked."""

    preconditioner = None

    def __init__(self, A: sparsetorch.SparseTensor, backend: str, method: str) -> None:
        self.A, self.backend, self.method = A, backend, method
        self.factors = None

    def set_values(self, values: torch.Tensor) -> None:
        self.factors = torch.linalg.lu_factor(self.A.with_values(values).to_dense())

    def solve(self, B: torch.Tensor, *, adjoint: bool = False, options=None):
        X = torch.linalg.lu_solve(*self.factors, B, adjoint=adjoint)
        return X, sparsetorch.IterationResult(0, float("nan"), True, sparsetorch.Status.DIRECT, "test double")


class FakeBackend:
    """A backend object with hook methods: one offer (or one decline) per request, cost given."""

    def __init__(self, name: str, *, seconds: float = 1e-9, nbytes: int = 0, priority: int = 0,
                 method: str = "lu", decline: str | None = None) -> None:
        self.name, self.seconds, self.nbytes, self.priority = name, seconds, nbytes, priority
        self.method, self.decline = method, decline
        self.requests: list = []
        self.built = 0

    @sparsetorch.hookimpl
    def sparsetorch_backend_info(self) -> BackendInfo:
        return BackendInfo(name=self.name, version="1.2.3", description="test double", devices=("cpu",),
                           dtypes=(torch.float64,), ops={"solve": (self.method,)}, priority=self.priority)

    @sparsetorch.hookimpl
    def sparsetorch_offers(self, request):
        self.requests.append(request)
        if self.decline:
            return [Decline(self.name, self.decline, self.method)]
        return [Offer(self.name, self.method, self.seconds, self.nbytes, self.build, notes="test double")]

    def build(self, A, request) -> DensePlan:
        self.built += 1
        return DensePlan(A, self.name, self.method)


class _Info:
    """Only a ``sparsetorch_backend_info`` hook (subclasses add the misbehaviour)."""

    name = "odd"

    @sparsetorch.hookimpl
    def sparsetorch_backend_info(self) -> BackendInfo:
        return BackendInfo(name=self.name, version="0", description="test double", devices=("cpu",),
                           dtypes=(torch.float64,), ops={"solve": ("lu",)})


class RaisingOffers(_Info):
    @sparsetorch.hookimpl
    def sparsetorch_offers(self, request):
        raise RuntimeError("boom: the solver library is on fire")


class WrongRecord(_Info):
    @sparsetorch.hookimpl
    def sparsetorch_offers(self, request):
        return [{"method": "lu", "seconds": 0.0}]


class NoneOffers(_Info):
    @sparsetorch.hookimpl
    def sparsetorch_offers(self, request):
        return None


class InvalidOffer(_Info):
    @sparsetorch.hookimpl
    def sparsetorch_offers(self, request):
        return [Offer("odd", "lu", -1.0, 0, lambda A, r: None)]  # the record itself refuses


class RaisingInfo:
    @sparsetorch.hookimpl
    def sparsetorch_backend_info(self):
        raise ImportError("libfancy.so: cannot open shared object file")

    @sparsetorch.hookimpl
    def sparsetorch_offers(self, request):
        return []


class GarbageInfo:
    @sparsetorch.hookimpl
    def sparsetorch_backend_info(self):
        return {"name": "garbage", "devices": ["cpu"]}


class UnknownMethodInfo:
    @sparsetorch.hookimpl
    def sparsetorch_backend_info(self):
        return BackendInfo(name="typo", version="0", description="", devices=("cpu",), dtypes=(torch.float64,),
                           ops={"solve": ("dense-lu",)})


class WrongHookSignature(_Info):
    @sparsetorch.hookimpl
    def sparsetorch_offers(self, req):  # the spec's argument is called "request"
        return []


# Fixtures -----------------------------------------------------------------------------------------
@pytest.fixture
def backends(monkeypatch):
    """The process-wide backends with the built-ins only (installed plugins such as eigen or scipy
    would take the picks these tests assert), reset before and after."""
    monkeypatch.setenv("SPARSETORCH_DISABLE_PLUGINS", "1")
    b = reset_backends()
    yield b
    monkeypatch.undo()  # the environment first, so the reset below loads the installed plugins again
    reset_backends()


def _system(n: int = 12, dtype=torch.float64) -> tuple[sparsetorch.SparseTensor, torch.Tensor, torch.Tensor]:
    D = torch.diag(torch.full((n,), 4.0))
    D += torch.diag(torch.full((n - 1,), -1.0), 1) + torch.diag(torch.full((n - 1,), -2.0), -1)
    D = D.to(dtype)
    return sparsetorch.SparseTensor.from_dense(D), D, torch.arange(1.0, n + 1, dtype=dtype)


def _rows(table, backend: str):
    return [r for r in table if r.backend == backend]


# (a) registration and selection -------------------------------------------------------------------
def test_registered_backend_is_chosen_when_cheapest(backends) -> None:
    fast = FakeBackend("fast", seconds=1e-9)
    backends.register(fast, "fast")
    assert "fast" in backends.names and backends.info("fast").version == "1.2.3"
    A, D, b = _system()
    table = sparsetorch.explain("solve", A, b)
    assert (table.chosen.backend, table.chosen.method, table.chosen.reason) == ("fast", "lu", "test double")
    assert _rows(table, "torch"), "the torch backend's rows stay in the table"
    x, info = sparsetorch.solve(A, b, return_info=True)
    assert (info.backend, info.method) == ("fast", "lu")
    assert fast.built == 1
    torch.testing.assert_close(x, torch.linalg.solve(D, b))
    req = fast.requests[-1]
    assert req.op == "solve" and req.A.shape == (12, 12) and req.A.dtype == torch.float64 and req.A.nse == A.nse


def test_registered_backend_is_not_chosen_when_dearer(backends) -> None:
    backends.register(FakeBackend("slow", seconds=10.0), "slow")
    A, D, b = _system()
    table = sparsetorch.explain("solve", A, b)
    assert table.chosen.backend == "torch"
    (slow,) = _rows(table, "slow")
    assert slow.offer is not None and not slow.chosen
    offers = table.offers
    assert offers[-1].backend == "slow", "the dearest offer ranks last"
    # ranked by seconds; offers within 1 % of each other tie and are ordered by the tie-breaks
    secs = [r.seconds for r in offers]
    assert all(later >= earlier / 1.01 - 1e-15 for earlier, later in zip(secs, secs[1:])), secs
    # Pinning it still works, and the answer is right.
    x, info = sparsetorch.solve(A, b, backend="slow", return_info=True)
    assert info.backend == "slow"
    torch.testing.assert_close(x, torch.linalg.solve(D, b))


def test_a_decline_and_its_reason_show_in_explain(backends) -> None:
    backends.register(FakeBackend("picky", decline="needs a banded matrix (bandwidth <= 3)"), "picky")
    A, D, b = _system()
    table = sparsetorch.explain("solve", A, b)
    (row,) = _rows(table, "picky")
    assert (row.offer, row.method, row.chosen) == (None, "lu", False)
    assert row.reason == "needs a banded matrix (bandwidth <= 3)"
    assert "picky" in str(table) and "needs a banded matrix" in str(table)
    assert sparsetorch.solve(A, b, return_info=True)[1].backend == "torch"
    with pytest.raises(sparsetorch.NoBackendError, match="needs a banded matrix"):
        sparsetorch.solve(A, b, backend="picky")


def test_unregister_removes_the_backend(backends) -> None:
    backends.register(FakeBackend("fast"), "fast")
    backends.unregister("fast")
    assert "fast" not in backends.names
    A, D, b = _system()
    assert not _rows(sparsetorch.explain("solve", A, b), "fast")


def test_registration_name_wins_over_the_declared_one(backends) -> None:
    plugin = FakeBackend("declared")  # its BackendInfo and its offers say "declared"
    backends.register(plugin, "registered")
    assert backends.names.count("registered") == 1 and "declared" not in backends.names
    A, D, b = _system()
    table = sparsetorch.explain("solve", A, b)
    assert table.chosen.backend == "registered" and not _rows(table, "declared")


# Tie-break: equal seconds -> lower peak bytes -> higher priority -> name; never registration order.
_TIES = [
    pytest.param(dict(seconds=1e-9, nbytes=200), dict(seconds=1e-9, nbytes=100), "b", id="bytes"),
    pytest.param(dict(seconds=1e-9, priority=1), dict(seconds=1e-9, priority=5), "b", id="priority"),
    pytest.param(dict(seconds=1e-9), dict(seconds=1e-9), "a", id="name"),
    pytest.param(dict(seconds=1e-9, nbytes=10**6), dict(seconds=2e-9, nbytes=0, priority=9), "a", id="seconds-first"),
]


@pytest.mark.parametrize(("kw_a", "kw_b", "winner"), _TIES)
@pytest.mark.parametrize("order", ["ab", "ba"])
def test_tie_break_is_documented_and_independent_of_registration_order(backends, kw_a, kw_b, winner, order) -> None:
    doubles = {"a": FakeBackend("tie_a", **kw_a), "b": FakeBackend("tie_b", **kw_b)}
    for key in order:
        backends.register(doubles[key], f"tie_{key}")
    A, D, b = _system()
    table = sparsetorch.explain("solve", A, b)
    loser = "b" if winner == "a" else "a"
    assert [r.backend for r in table.offers[:2]] == [f"tie_{winner}", f"tie_{loser}"]
    assert sparsetorch.solve(A, b, return_info=True)[1].backend == f"tie_{winner}"


def test_offers_within_one_percent_tie_and_fall_to_the_documented_rule() -> None:
    """0.5 % apart is a tie (bytes decide); 2 % apart is not (seconds decide)."""
    from sparsetorch.dispatch.records import Offer
    from sparsetorch.dispatch.select import _ordered

    build = lambda A, r: None  # noqa: E731
    a = Offer("a", "lu", 1.000, 200, build)
    b = Offer("b", "lu", 1.005, 100, build)
    c = Offer("c", "lu", 1.020, 10, build)
    assert [o.backend for o in _ordered([c, a, b], {})] == ["b", "a", "c"]
    assert [o.backend for o in _ordered([a, Offer("z", "lu", 1.0, 200, build)], {"z": 1})] == ["z", "a"]


# (b) misbehaving plugins --------------------------------------------------------------------------
def test_raising_offers_become_a_decline_carrying_the_exception(backends) -> None:
    backends.register(RaisingOffers(), "odd")
    A, D, b = _system()
    table = sparsetorch.explain("solve", A, b)
    (row,) = _rows(table, "odd")
    assert row.offer is None
    assert "raised RuntimeError: boom: the solver library is on fire" in row.reason
    assert "test_plugins.py" in row.reason, "the reason says where it was raised"
    x, info = sparsetorch.solve(A, b, return_info=True)
    assert info.backend == "torch"
    torch.testing.assert_close(x, torch.linalg.solve(D, b))


def test_an_invalid_offer_record_is_reported_as_a_decline(backends) -> None:
    backends.register(InvalidOffer(), "odd")
    A, D, b = _system()
    (row,) = _rows(sparsetorch.explain("solve", A, b), "odd")
    assert "raised ValueError" in row.reason and "invalid seconds=-1.0" in row.reason


def test_a_non_offer_answer_is_a_plugin_bug_decline(backends) -> None:
    backends.register(WrongRecord(), "odd")
    A, D, b = _system()
    (row,) = _rows(sparsetorch.explain("solve", A, b), "odd")
    assert row.reason == "returned dict, not an Offer or Decline (plugin bug)"
    assert sparsetorch.solve(A, b, return_info=True)[1].backend == "torch"


def test_returning_none_is_reported(backends) -> None:
    backends.register(NoneOffers(), "odd")
    A, D, b = _system()
    (row,) = _rows(sparsetorch.explain("solve", A, b), "odd")
    assert row.reason == "returned no offer for this request"


@pytest.mark.parametrize(
    ("plugin", "words"),
    [
        (RaisingInfo(), "backend_info failed: ImportError: libfancy.so: cannot open shared object file"),
        (GarbageInfo(), "backend_info failed: TypeError: sparsetorch_backend_info returned dict, expected BackendInfo"),
        (UnknownMethodInfo(), "unknown methods ['dense-lu'] for 'solve'; known:"),
        (WrongHookSignature(), "sparsetorch_offers"),
    ],
    ids=["raises", "garbage", "unknown-method", "hook-signature"],
)
def test_broken_backend_info_is_listed_and_does_not_break_dispatch(backends, plugin, words) -> None:
    backends.register(plugin, "shaky")
    assert "shaky" not in backends.names
    (broken,) = [b for b in backends.broken if b.name == "shaky"]
    assert words in broken.error
    A, D, b = _system()
    table = sparsetorch.explain("solve", A, b)
    (row,) = _rows(table, "shaky")
    assert row.reason.startswith("failed to load: ") and words in row.reason
    x, info = sparsetorch.solve(A, b, return_info=True)
    assert info.backend == "torch"
    torch.testing.assert_close(x, torch.linalg.solve(D, b))


def test_a_second_backend_with_a_taken_name_is_broken(backends) -> None:
    backends.register(FakeBackend("torch", seconds=0.0), "torch")
    assert any(b.name == "torch" and "already loaded" in b.error for b in backends.broken)
    A, D, b = _system()
    assert sparsetorch.solve(A, b, return_info=True)[1].backend == "torch"


def test_cli_lists_loaded_and_broken_backends(backends) -> None:
    from sparsetorch import cli

    backends.register(FakeBackend("fast"), "fast")
    backends.register(RaisingInfo(), "shaky")
    text = "\n".join(cli._backend_lines())
    assert "torch" in text and "sparsetorch" in text
    assert "fast" in text and "1.2.3" in text and "solve: lu" in text
    assert "shaky" in text and "BROKEN" in text and "libfancy.so" in text


def test_public_registry_accessor_survives_loading() -> None:
    get_backends()  # imports sparsetorch.backends.torch_native
    assert callable(sparsetorch.registry)
    assert sparsetorch.registry() is get_backends()


# (c)-(e) the real entry-point path ----------------------------------------------------------------
_SCRIPT = r"""
import json, sys
import torch
import sparsetorch
from sparsetorch.dispatch import get_backends

out = {"lazy": "sparsetorch_example.plugin" not in sys.modules}
b = get_backends()
out["names"] = b.names
out["broken"] = [[x.name, x.error] for x in b.broken]
if "example" in b.names:
    info = b.info("example")
    out["info"] = {"distribution": info.distribution, "version": info.version, "ops": dict(info.ops)}
out["scipy_after_load"] = "scipy" in sys.modules

n = 50
D = (torch.diag(torch.full((n,), 4.0)) + torch.diag(torch.full((n - 1,), -1.0), 1)
     + torch.diag(torch.full((n - 1,), -2.0), -1)).double()
A = sparsetorch.SparseTensor.from_dense(D)
rhs = torch.arange(1.0, n + 1, dtype=torch.float64)
exact = torch.linalg.solve(D, rhs)

table = sparsetorch.explain("solve", A, rhs)
out["scipy_after_explain"] = "scipy" in sys.modules
out["table"] = str(table)
out["offers"] = [[r.backend, r.method, r.seconds, r.bytes] for r in table.offers]
out["chosen"] = [table.chosen.backend, table.chosen.method]
if "example" in b.names:
    x, si = sparsetorch.solve(A, rhs, backend="example", return_info=True)
    out["pinned"] = [si.backend, si.method, float((x - exact).abs().max())]
    budget = next(r.bytes for r in table.offers if r.backend == "example")
    t2 = sparsetorch.explain("solve", A, rhs, max_bytes=budget)
    x2, si2 = sparsetorch.solve(A, rhs, max_bytes=budget, return_info=True)
    out["budget"] = {"table": str(t2), "chosen": [si2.backend, si2.method], "err": float((x2 - exact).abs().max()),
                     "offers": [[r.backend, r.method, r.seconds, r.bytes] for r in t2.offers]}
    t3 = sparsetorch.explain("solve", A.to(torch.float32), rhs.float())
    out["float32"] = {"chosen": [t3.chosen.backend, t3.chosen.method],
                      "example": [[r.method, r.reason] for r in t3.declines if r.backend == "example"]}
else:
    try:
        sparsetorch.solve(A, rhs, backend="example")
    except sparsetorch.NoBackendError as exc:
        out["pinned_error"] = str(exc)
print("RESULT " + json.dumps(out))
"""


@pytest.fixture(scope="module")
def installed_template(tmp_path_factory) -> Path:
    """``pip install --no-deps --no-build-isolation --target <tmp>`` of the template (offline).

    The template is copied first so the build leaves no build/ or *.egg-info in the repository.
    """
    assert TEMPLATE.is_dir(), f"{TEMPLATE} is missing"
    base = tmp_path_factory.mktemp("plugin")
    src, target = base / "src", base / "site"
    shutil.copytree(TEMPLATE, src, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__", ".pytest_cache"))
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "--no-index",
         "--disable-pip-version-check", "--quiet", "--target", str(target), str(src)],
        capture_output=True, text=True, timeout=180, check=False,
    )
    assert proc.returncode == 0, f"pip install of the template failed:\n{proc.stdout}\n{proc.stderr}"
    (dist,) = target.glob("sparsetorch_example-*.dist-info")
    assert 'example = sparsetorch_example.plugin' in (dist / "entry_points.txt").read_text()
    return target


def _env(site: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPARSETORCH_")}
    env["PYTHONPATH"] = os.pathsep.join([str(site), str(CORE)])
    env["SPARSETORCH_CALIBRATION"] = "defaults"  # deterministic estimates, no measuring
    # Only the template among external plugins: others installed in the environment (scipy,
    # eigen, cupy) would otherwise compete for the auto picks these tests assert.
    env["SPARSETORCH_PLUGINS"] = "example"
    env.update(extra)
    return env


def _run_script(site: Path, **extra: str) -> dict:
    proc = subprocess.run([sys.executable, "-c", _SCRIPT], capture_output=True, text=True, timeout=120,
                          env=_env(site, **extra), cwd=str(site.parent), check=False)
    assert proc.returncode == 0, proc.stderr
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])


def test_entry_point_plugin_is_loaded_chosen_and_declines(installed_template) -> None:
    out = _run_script(installed_template)
    # Found through the entry point (the distribution name comes from its metadata), loaded lazily,
    # and import-light (no SciPy until a plan is built).
    assert out["lazy"], "import sparsetorch must not load plugins"
    assert out["names"][:1] == ["torch"] and "example" in out["names"] and out["broken"] == []
    assert out["info"] == {"distribution": "sparsetorch-example", "version": "0.1.0", "ops": {"solve": ["lu"]}}
    assert not out["scipy_after_load"] and not out["scipy_after_explain"]
    # Pinned: it runs, and the answer is right.
    backend, method, err = out["pinned"]
    assert (backend, method) == ("example", "lu") and err < 1e-12
    # Unconstrained: the chosen row is the best-ranked offer (lowest seconds, or a tie won by bytes).
    assert "example" in out["table"] and "dense LU (SciPy getrf" in out["table"]
    best = out["offers"][0]
    assert out["chosen"] == best[:2]
    assert all(best[2] <= o[2] * 1.01 for o in out["offers"])
    # Under a memory budget that only its in-place factorization meets (among the direct methods),
    # auto-selection picks it because its estimate is now the lowest; the table shows why.
    budget = out["budget"]
    assert budget["chosen"] == ["example", "lu"] and budget["err"] < 1e-12
    assert budget["offers"][0][:2] == ["example", "lu"]
    assert all(budget["offers"][0][2] < o[2] for o in budget["offers"][1:])
    assert "needs 40 kB > max_bytes" in budget["table"]
    # float32: it is declined for the dtype it did not declare (by the core, from its BackendInfo),
    # and the torch backend takes the call.
    assert out["float32"]["chosen"][0] == "torch"
    assert out["float32"]["example"] == [[None, "does not support dtype float32 (it has: float64)"]]


@pytest.mark.parametrize(
    ("env", "visible"),
    [
        ({"SPARSETORCH_DISABLE_PLUGINS": "1"}, False),
        ({"SPARSETORCH_DISABLE_PLUGINS": "example"}, False),
        ({"SPARSETORCH_DISABLE_PLUGINS": "other"}, True),
        ({"SPARSETORCH_PLUGINS": "other"}, False),
        ({"SPARSETORCH_PLUGINS": "other,example"}, True),
    ],
    ids=["disable-all", "disable-example", "disable-other", "allow-other", "allow-example"],
)
def test_environment_variables_hide_the_plugin(installed_template, env, visible) -> None:
    out = _run_script(installed_template, **env)
    assert "torch" in out["names"], "built-ins stay loaded"
    assert ("example" in out["names"]) is visible
    assert out["broken"] == []
    if not visible:
        assert "example" not in out["table"]
        assert "backend='example' is not loaded" in out["pinned_error"]
        assert "SPARSETORCH_PLUGINS" in out["pinned_error"]


def test_cli_info_lists_the_entry_point_backend(installed_template) -> None:
    proc = subprocess.run([sys.executable, "-m", "sparsetorch", "info"], capture_output=True, text=True,
                          timeout=120, env=_env(installed_template), check=False)
    assert proc.returncode == 0, proc.stderr
    section = proc.stdout.split("backends:", 1)[1]
    line = next(x for x in section.splitlines() if x.strip().startswith("example"))
    assert "0.1.0" in line and "sparsetorch-example" in line and "cpu" in line
    assert "solve: lu" in section and "torch" in section
    hidden = subprocess.run([sys.executable, "-m", "sparsetorch", "info"], capture_output=True, text=True,
                            timeout=120, env=_env(installed_template, SPARSETORCH_DISABLE_PLUGINS="1"), check=False)
    assert hidden.returncode == 0, hidden.stderr
    assert "sparsetorch-example" not in hidden.stdout and "SPARSETORCH_DISABLE_PLUGINS=1" in hidden.stdout


def test_template_own_tests_pass_against_the_installed_package(installed_template) -> None:
    tests = installed_template.parent / "src" / "tests"
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tests)],
                          capture_output=True, text=True, timeout=300, env=_env(installed_template),
                          cwd=str(tests.parent), check=False)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert " passed" in proc.stdout


def test_allow_transfer_lets_a_backend_answer_for_a_device_it_did_not_declare(backends) -> None:
    backends.register(FakeBackend("cpuonly"), "cpuonly")  # declares devices=("cpu",)
    from sparsetorch.dispatch.records import OperandInfo, Request

    meta = OperandInfo("sparse", (4, 4), torch.float64, torch.device("meta"))
    plain = Request("solve", (meta,), frozenset(), {})
    allowed = Request("solve", (meta,), frozenset(), {"backend_options": {"allow_transfer": True}})
    decline = next(a for a in backends.offers(plain) if a.backend == "cpuonly")
    assert "runs on" in decline.reason and "meta" in decline.reason
    asked = [a for a in backends.offers(allowed) if a.backend == "cpuonly"]
    assert asked and all("runs on" not in getattr(a, "reason", "") for a in asked)


# --- typed plan capabilities ----------------------------------------------------------------------
def test_a_plan_with_its_own_sddmm_computes_the_values_gradient(backends) -> None:
    """A product plan that satisfies ``SampledProduct`` answers matmul's values-gradient with its
    own kernel (first-order backward); the result equals the core's."""
    from sparsetorch.dispatch.plans import MatmulPlan, SampledProduct
    from sparsetorch.testing.problems import poisson2d

    calls = []

    class Sampled:
        def __init__(self, A):
            self.A = A
            self.values = None

        def set_values(self, values):
            self.values = values

        def apply(self, X, *, adjoint=False):
            D = self.A.with_values(self.values).to_dense()
            return (D.mT.conj() if adjoint else D) @ X

        def sddmm(self, P, Q):
            calls.append((tuple(P.shape), tuple(Q.shape)))
            coords, slot = self.A.entries()
            out = torch.zeros(*P.shape[:-2], self.A.values.shape[-1], dtype=P.dtype)
            out[..., slot] = (P[..., coords[0], :] * Q[..., coords[1], :]).sum(-1)
            return out

    assert isinstance(Sampled(None), SampledProduct) and isinstance(Sampled(None), MatmulPlan)

    class Hooks:
        @sparsetorch.hookimpl
        def sparsetorch_backend_info(self) -> BackendInfo:
            return BackendInfo(name="sampled", version="0", description="test double", devices=("cpu",),
                               dtypes=(torch.float64,), ops={"matmul": ("spmm",)})

        @sparsetorch.hookimpl
        def sparsetorch_offers(self, request):
            return [Offer("sampled", "spmm", 1e-9, 0, lambda A, r: Sampled(A))] if request.op == "matmul" else []

    backends.register(Hooks(), "sampled")
    A = poisson2d(4, 4)
    X = torch.randn(16, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    v = A.values.clone().requires_grad_(True)
    (sparsetorch.matmul(A.with_values(v), X, backend="sampled") ** 2).sum().backward()
    v2 = A.values.clone().requires_grad_(True)
    (sparsetorch.matmul(A.with_values(v2), X, backend="torch") ** 2).sum().backward()
    assert calls, "the plan's sddmm was not used"
    torch.testing.assert_close(v.grad, v2.grad)
