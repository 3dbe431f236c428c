"""The plugin contract where a third-party plugin breaks it (session 27's sweep with a misbehaving
plugin): a misspelled hook name, an offer of a method the backend did not declare, a plugin left
out by the loading variables, eigenpairs returned in descending order; and the documentation of the
tie rule, the core's own declines and the plugins' lower bound on the core.

Backends are registered in-process (as tests/test_plugins.py does); "installed" plugins are
fake entry points that replace ``importlib.metadata`` in ``dispatch/select.py`` for one test.
"""

from __future__ import annotations

import re
import types
from pathlib import Path

import pytest
import torch

import sparsetorch
from sparsetorch import BackendInfo, Offer
from sparsetorch.dispatch import reset_backends
from sparsetorch.dispatch import select

from test_plugins import DensePlan, backends  # noqa: F401 - the fixture

ROOT = Path(__file__).resolve().parents[1]


# Test doubles and fixtures -------------------------------------------------------------------------
class Good:
    """A correct backend declaring solve: lu, cheaper than anything."""

    def __init__(self, name: str = "good") -> None:
        self.name = name

    @sparsetorch.hookimpl
    def sparsetorch_backend_info(self) -> BackendInfo:
        return BackendInfo(name=self.name, version="1", description="test double", devices=("cpu",),
                           dtypes=(torch.float64,), ops={"solve": ("lu",)})

    @sparsetorch.hookimpl
    def sparsetorch_offers(self, request):
        return [Offer(self.name, "lu", 1e-12, 0, lambda A, r: DensePlan(A, self.name, "lu"), notes="test double")]


class FakeEntryPoint:
    """An installed plugin as ``importlib.metadata`` lists it."""

    def __init__(self, name: str, plugin, dist: str = "sparsetorch-fake") -> None:
        self.name, self._plugin = name, plugin
        self.dist = types.SimpleNamespace(name=dist, version="9.9")

    def load(self):
        return self._plugin


@pytest.fixture
def installed(monkeypatch):
    """``installed(*entry_points, **env)``: those are the only installed plugins, the loading
    variables are ``env``, and the process-wide backends are reloaded (and reset afterwards)."""

    def load(*eps: FakeEntryPoint, **env: str):
        fake = types.SimpleNamespace(entry_points=lambda group=None, **kw: list(eps) if group == select.ENTRY_POINT_GROUP else [])
        monkeypatch.setattr(select, "metadata", fake)
        for var in ("SPARSETORCH_DISABLE_PLUGINS", "SPARSETORCH_PLUGINS"):
            monkeypatch.delenv(var, raising=False)
        for var, value in env.items():
            monkeypatch.setenv(var, value)
        return reset_backends()

    yield load
    monkeypatch.undo()
    reset_backends()


def _system(n: int = 6):
    D = torch.diag(torch.full((n,), 4.0, dtype=torch.float64)) + torch.diag(torch.full((n - 1,), -1.0, dtype=torch.float64), 1)
    return sparsetorch.SparseTensor.from_dense(D), D, torch.arange(1.0, n + 1, dtype=torch.float64)


def _doc(name: str) -> str:
    return " ".join((ROOT / "docs" / name).read_text().split())


# 1. a misspelled hook name -------------------------------------------------------------------------
class Typo:
    """``sparsetorch_offer`` (no s): a hook no spec declares."""

    @sparsetorch.hookimpl
    def sparsetorch_backend_info(self) -> BackendInfo:
        return BackendInfo(name="typo", version="1", description="test double", devices=("cpu",),
                           dtypes=(torch.float64,), ops={"solve": ("lu",)})

    @sparsetorch.hookimpl
    def sparsetorch_offer(self, request):
        return []


class OptionalExtra(Good):
    """A hook of a later core, marked optional: pluggy accepts it without a spec."""

    @sparsetorch.hookimpl(optionalhook=True)
    def sparsetorch_some_future_hook(self):
        return None


def test_a_misspelled_hook_registered_at_run_time_is_broken_and_dispatch_goes_on(backends) -> None:  # noqa: F811
    backends.register(Typo(), "typo")  # raised pluggy's PluginValidationError, leaving "typo" in .names
    assert "typo" not in backends.names
    (broken,) = [b for b in backends.broken if b.name == "typo"]
    assert "PluginValidationError: unknown hook 'sparsetorch_offer'" in broken.error
    assert "did you mean 'sparsetorch_offers'?" in broken.error
    backends.register(Good(), "good")  # raised again for every later registration
    A, D, b = _system()
    table = sparsetorch.explain("solve", A, b)
    (row,) = [r for r in table if r.backend == "typo"]
    assert row.reason.startswith("failed to load: PluginValidationError: unknown hook 'sparsetorch_offer'")
    x, info = sparsetorch.solve(A, b, return_info=True)
    assert info.backend == "good"
    torch.testing.assert_close(x, torch.linalg.solve(D, b))


def test_a_misspelled_hook_in_an_installed_plugin_leaves_the_others_loaded(installed) -> None:
    from sparsetorch import cli

    # every dispatch and `sparsetorch info` raised ("backend discovery failed") for one such plugin
    b = installed(FakeEntryPoint("typo", Typo(), "sparsetorch-typo"), FakeEntryPoint("good", Good(), "sparsetorch-good"))
    assert "good" in b.names and "typo" not in b.names
    (broken,) = b.broken
    assert (broken.name, broken.distribution) == ("typo", "sparsetorch-typo")
    assert "unknown hook 'sparsetorch_offer'" in broken.error
    A, D, rhs = _system()
    assert sparsetorch.solve(A, rhs, return_info=True)[1].backend == "good"
    text = "\n".join(cli._backend_lines())
    assert "discovery failed" not in text
    assert "typo" in text and "BROKEN (sparsetorch-typo)" in text and "sparsetorch_offer" in text


def test_an_optional_hook_the_core_does_not_know_is_accepted(backends) -> None:  # noqa: F811
    backends.register(OptionalExtra(), "extra")
    assert "extra" in backends.names and not backends.broken


# 2. offers of a method the backend did not declare ----------------------------------------------
class Claims(Good):
    """Declares solve: lu, offers another method (a vocabulary one it did not declare, or one
    outside the vocabulary), cheaper than anything."""

    def __init__(self, method: str) -> None:
        super().__init__("claims")
        self.method = method

    @sparsetorch.hookimpl
    def sparsetorch_offers(self, request):
        return [Offer(self.name, self.method, 1e-12, 0, lambda A, r: DensePlan(A, self.name, self.method))]


@pytest.mark.parametrize(("method", "words"), [
    ("cg", "offered method 'cg' for solve, which its BackendInfo does not declare (its declared solve methods: lu)"),
    ("warp_drive", "offered method 'warp_drive', which is not a sparsetorch method (its declared solve methods: lu"),
], ids=["undeclared", "unknown"])
def test_an_offer_of_an_undeclared_method_is_declined_naming_plugin_and_method(backends, method, words) -> None:  # noqa: F811
    backends.register(Claims(method), "claims")
    A, D, b = _system()
    table = sparsetorch.explain("solve", A, b)
    (row,) = [r for r in table if r.backend == "claims"]
    assert row.offer is None and row.method == method and not row.chosen
    assert "plugin 'claims'" in row.reason and words in row.reason and "plugin bug" in row.reason
    x, info = sparsetorch.solve(A, b, return_info=True)  # it was chosen and ran
    assert info.backend == "torch"
    torch.testing.assert_close(x, torch.linalg.solve(D, b))
    with pytest.raises(sparsetorch.NoBackendError, match=re.escape(words)):
        sparsetorch.solve(A, b, backend="claims")


# 3. a plugin installed but left out by the loading variables -------------------------------------
@pytest.mark.parametrize(("env", "words"), [
    ({"SPARSETORCH_DISABLE_PLUGINS": "other,good"}, "disabled by SPARSETORCH_DISABLE_PLUGINS='other,good'"),
    ({"SPARSETORCH_DISABLE_PLUGINS": "all"}, "disabled by SPARSETORCH_DISABLE_PLUGINS='all' (every external plugin)"),
    ({"SPARSETORCH_PLUGINS": "other"}, "filtered out by SPARSETORCH_PLUGINS='other'"),
], ids=["disabled", "disabled-all", "not-allowed"])
def test_pinning_a_filtered_plugin_says_which_variable_left_it_out(installed, env, words) -> None:
    b = installed(FakeEntryPoint("good", Good(), "sparsetorch-good"), FakeEntryPoint("gooe", Good("gooe")), **env)
    assert "good" not in b.names
    A, D, rhs = _system()
    with pytest.raises(sparsetorch.NoBackendError) as err:
        sparsetorch.solve(A, rhs, backend="good")
    text = str(err.value)
    # it said "is not loaded (did you mean 'gooe'?) ... Install its plugin"
    assert "backend='good' is not loaded: it is installed (sparsetorch-good 9.9) but " + words in text
    assert "did you mean" not in text and "Install its plugin" not in text
    assert "reset_backends()" in text


def test_pinning_a_plugin_that_is_not_installed_keeps_the_install_advice(installed) -> None:
    installed(FakeEntryPoint("good", Good()), SPARSETORCH_DISABLE_PLUGINS="good")
    A, D, rhs = _system()
    with pytest.raises(sparsetorch.NoBackendError, match=r"is not loaded \(did you mean 'torch'\?\).*Install its plugin"):
        sparsetorch.solve(A, rhs, backend="torchh")


@pytest.mark.parametrize("value", ["1", "all", "ALL", "true", "TRUE", "True", "yes", "Yes", "on", "ON", " 1 "])
def test_disable_plugins_accepts_truthy_spellings_in_any_case(installed, value) -> None:
    b = installed(FakeEntryPoint("good", Good()), SPARSETORCH_DISABLE_PLUGINS=value)
    assert b.names == ["torch"], f"SPARSETORCH_DISABLE_PLUGINS={value!r} loaded {b.names}"


@pytest.mark.parametrize("value", ["", "other", "0"])
def test_disable_plugins_other_values_leave_the_plugin_loaded(installed, value) -> None:
    b = installed(FakeEntryPoint("good", Good()), SPARSETORCH_DISABLE_PLUGINS=value)
    assert "good" in b.names


def test_docs_list_the_disable_spellings_the_loader_accepts() -> None:
    text = _doc("backend-authors.md")
    row = text.split("| `SPARSETORCH_DISABLE_PLUGINS` |", 1)[1].split("|", 1)[0]
    assert all(f"`{s}`" in row for s in select.DISABLE_ALL) and "any case" in row
# 4. eigenpairs returned in descending order --------------------------------------------------------
class DescendingEigPlan:
    """eigsh by torch.linalg.eigh, returning the wanted pairs in descending order (the contract
    says ascending)."""

    preconditioner = None
    backend, method = "desc", "dense"

    def __init__(self, A) -> None:
        self.A = A
        self.D = None

    def set_values(self, values: torch.Tensor) -> None:
        self.D = self.A.with_values(values).to_dense()

    def eigsh(self, k, *, which="LA", sigma=None, M=None, tol=0.0, maxiter=None, v0=None):
        w, V = torch.linalg.eigh(self.D)
        w, V = (w[..., :k], V[..., :k]) if which in ("SA", "SM") else (w[..., -k:], V[..., -k:])
        return w.flip(-1), V.flip(-1), sparsetorch.IterationResult(0, float("nan"), True, sparsetorch.Status.DIRECT,
                                                                     "descending")


class Descending:
    @sparsetorch.hookimpl
    def sparsetorch_backend_info(self) -> BackendInfo:
        return BackendInfo(name="desc", version="1", description="test double", devices=("cpu",),
                           dtypes=(torch.float64,), ops={"eigsh": ("dense",)})

    @sparsetorch.hookimpl
    def sparsetorch_offers(self, request):
        return [Offer("desc", "dense", 1e-12, 0, lambda A, r: DescendingEigPlan(A), notes="descending")]


@pytest.mark.parametrize("which", ["SA", "LA"])
def test_eigsh_reorders_descending_pairs_ascending(backends, which) -> None:  # noqa: F811
    backends.register(Descending(), "desc")
    g = torch.Generator().manual_seed(0)
    n, k = 8, 3
    R = torch.randn(n, n, dtype=torch.float64, generator=g) * (torch.rand(n, n, generator=g) < 0.4)
    D = R @ R.T + n * torch.eye(n, dtype=torch.float64)
    A = sparsetorch.SparseTensor.from_dense(D)
    w, V, info = sparsetorch.eigsh(A, k, which=which, backend="desc", return_info=True)
    assert (info.backend, info.method) == ("desc", "dense")
    ref = torch.linalg.eigvalsh(D)
    want = ref[:k] if which == "SA" else ref[-k:]
    torch.testing.assert_close(w, want)  # it returned them descending
    torch.testing.assert_close(D @ V, V * w, atol=1e-10, rtol=0)  # each vector moved with its value


def test_eigsh_reorders_each_member_of_a_value_batch_and_its_gradient_follows(backends) -> None:  # noqa: F811
    backends.register(Descending(), "desc")
    A, D, _ = _system(7)
    D = D + D.T
    A = sparsetorch.SparseTensor.from_dense(D)
    vals = torch.stack([A.values, 2.0 * A.values + 0.5 * (A.values != 0)])
    v1 = vals.clone().requires_grad_(True)
    w1, V1 = sparsetorch.eigsh(A.with_values(v1), 2, which="SA", backend="desc")
    v2 = vals.clone().requires_grad_(True)
    w2, V2 = sparsetorch.eigsh(A.with_values(v2), 2, which="SA", backend="torch", method="dense")
    torch.testing.assert_close(w1, w2)
    assert bool((w1[..., 1:] >= w1[..., :-1]).all())
    (w1 @ torch.tensor([1.0, 3.0], dtype=torch.float64)).sum().backward()
    (w2 @ torch.tensor([1.0, 3.0], dtype=torch.float64)).sum().backward()
    torch.testing.assert_close(v1.grad, v2.grad)


def test_ascending_reports_pairs_it_cannot_reorder() -> None:
    from sparsetorch.ops.spectral._checks import _ascending

    w = torch.tensor([3.0, 1.0], dtype=torch.float64)
    V = torch.eye(2, dtype=torch.float64)
    assert _ascending(w, V) is None and w.tolist() == [1.0, 3.0] and V.tolist() == [[0.0, 1.0], [1.0, 0.0]]
    with torch.inference_mode():
        wi, Vi = torch.tensor([3.0, 1.0]), torch.eye(2)
    assert "not in ascending order" in _ascending(wi, Vi)


# 5. the documentation says what the code does ------------------------------------------------------
def test_docs_describe_the_tie_rule_the_code_applies() -> None:
    from sparsetorch.dispatch.select import _ordered

    build = lambda A, r: None  # noqa: E731
    # 1.0e-3 and 1.0099e-3 fall in different 1 % logarithmic buckets (-694 and -693), which the
    # doc described; the code groups estimates within 1 % of the cheapest remaining one
    a, b = Offer("a", "lu", 1.0e-3, 1000, build), Offer("b", "lu", 1.0099e-3, 10, build)
    assert [o.backend for o in _ordered([a, b], {})] == ["b", "a"]
    text = _doc("backend-authors.md")
    assert "logarithmic" not in text
    assert "within 1 % of the cheapest remaining" in text


def test_docs_say_the_core_declines_undeclared_devices_dtypes_and_methods() -> None:
    text = _doc("backend-authors.md")
    assert "does not filter requests by" not in text
    assert "Device support is up to the offers themselves" not in text
    assert "does not support dtype" in text and "does not declare" in text


def test_docs_state_the_core_lower_bound_the_in_tree_plugins_declare() -> None:
    bounds = set()
    for toml in [*ROOT.glob("plugins/*/pyproject.toml"), ROOT / "examples" / "plugin_template" / "pyproject.toml"]:
        bounds |= set(re.findall(r'"sparsetorch>=([0-9.]+)"', toml.read_text()))
    (bound,) = bounds
    text = _doc("backend-authors.md")
    claimed = set(re.findall(r"sparsetorch>=([0-9.]+)", text))
    assert claimed == {bound}, (claimed, bound)
