"""Bad input on some ranks of a collective entry point: every rank raises the same specific error at once.

A rank whose own argument is wrong (a ``with_values`` of the wrong length, a right-hand side of the wrong
local length, an argument of the wrong kind...) used to raise alone while the others went on into the
operation's next collective and waited there until the process group's timeout. Each entry point now checks
its per-rank input and agrees with the others in one small all_reduce first (``Comm.checked``).

One launch at 3 gloo ranks runs every case (``_agree_scenarios.py``), each in a process group of its own with
a 10 s timeout, so a regression shows as a ``CommTimeoutError`` after 10 s on the good ranks of that case (a
failure here), never as a hang; the launch itself is killed after 60 s.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
P = 3
COLLECTIVE_TIMEOUT = 10.0   # seconds: a rank left waiting fails after this (each case has its own group)
PROMPT = 5.0                # seconds: what "at once" means here (an all_reduce and an all_gather on loopback)

#: case -> (class every rank raises, what every rank's message must contain: rank 2 is the last rank; {nse0},
#: {nse2} rank 0's and rank 2's value slots, {nin2} rank 2's input entries)
EXPECTED = {
    "with_values_length": ("InputError", ["distributed solve failed on rank 2 (failing ranks: [2])",
                                          "rank 2 expected values of shape (*batch, {nse2}), got shape ({nse2m1},)",
                                          "pass {nse2} per matrix on rank 2"]),
    "with_values_two_ranks": ("InputError", ["failing ranks: [0, 2]", "rank 0 expected values of shape (*batch, {nse0}), got shape ({nse0p1},)",
                                             "rank 2 expected values of shape (*batch, {nse2}), got shape ({nse2m2},)"]),
    "with_values_dtype": ("InputError", ["rank 2 passed torch.float32 values for a torch.float64 matrix"]),
    "with_values_not_a_tensor": ("InputError", ["rank 2 passed a list"]),
    "with_values_batch": ("MismatchError", ["A batch: rank 0=(), rank 1=(), rank 2=(2,)"]),
    "with_entry_values_length": ("InputError", ["DSparseTensor matmul failed on rank 2",
                                                "rank 2 expected values of shape (*batch, {nin2}), got shape ({nin2m1},)"]),
    "with_entry_values_not_a_tensor": ("InputError", ["rank 2 passed a list"]),
    "matmul_length": ("InputError", ["matmul failed on rank 2", "rank 2 owns 22 rows", "shape (21,)"]),
    "solve_length": ("InputError", ["solve failed on rank 2", "rank 2 owns 22 rows", "shape (21,)"]),
    "list_member": ("InputError", ["DSparseTensorList failed on rank 2", "member 1 a str"]),
    "list_solve_rhs": ("InputError", ["needs 2 right-hand sides, got 1 on rank 2"]),
    "list_eigsh_v0": ("InputError", ["takes no v0 (rank 2 passed one"]),
    "dot_not_a_tensor": ("InputError", ["dot: y is a list on rank 2"]),
    "from_local_rows_shape": ("InputError", ["from_local_rows failed on rank 2", "shape must be a pair (N, N) of ints, "
                                                                                 "got None on rank 2"]),
    "nonlinear_rtol": ("InputError", ["nonlinear_solve failed on rank 2", "rtol must be a number >= 0 or None, got 'tight' "
                                                                          "on rank 2"]),
    # a conversion that failed after the agreement (on that rank alone); any exception of a check is an InputError
    "eigsh_degenerate_tol": ("InputError", ["eigsh failed on rank 2", "rank 2's input raised ValueError"]),
    "scatter_src_out_of_range": ("InputError", ["scatter: src must be the rank holding A, an int in 0..2, got 5 on rank 0",
                                                "failing ranks: [0, 1, 2]"]),
    "scatter_src_negative": ("InputError", ["src must be the rank holding A, an int in 0..2, got -1 on rank 0"]),
    "scatter_src_differs": ("MismatchError", ["the ranks disagree on src (src: rank 0=0, rank 1=0, rank 2=1)"]),
    "from_local_rows_dtype_differs": ("MismatchError", ["dtype: rank 0=float64, rank 1=float64, rank 2=float32"]),
    "eigsh_which_differs": ("MismatchError", ["which: rank 0=LA, rank 1=LA, rank 2=SA"]),
    # grad mode off on one rank only: its agreement on gradients was skipped (the others waited in it)
    "grad_mode_matmul": ("MismatchError", ["DSparseTensor matmul: grad mode differs between the ranks: "
                                           "torch.is_grad_enabled() is False on rank 2 while rank 0, rank 1 record"]),
    "grad_mode_solve": ("MismatchError", ["distributed solve: grad mode differs", "False on rank 2"]),
    "grad_mode_eigsh": ("MismatchError", ["distributed eigsh: grad mode differs", "False on rank 2"]),
    # a solve callback raising on rank 0 alone: the same failure protocol as a raising preconditioner
    "solve_callback": ("DistributedError", ["failed on rank 0 (failing ranks: [0])",
                                            "the solve callback raised OSError: log file full"]),
    "solve_callback_block": ("DistributedError", ["failed on rank 0 (failing ranks: [0])",
                                                  "the solve callback raised OSError: log file full"]),
}


@pytest.fixture(scope="module")
def outs(tmp_path_factory):
    from sparsetorch_distributed.launch import run_local

    env = {"PYTHONPATH": os.pathsep.join([str(HERE), str(HERE.parent), os.environ.get("PYTHONPATH", "")])}
    barrier = tmp_path_factory.mktemp("agree-barrier")
    # a regression: every case that leaves ranks waiting costs COLLECTIVE_TIMEOUT, the launch fails at `timeout`
    return run_local(P, "_agree_scenarios:run_all", (str(barrier), COLLECTIVE_TIMEOUT), timeout=60, env=env,
                     collective_timeout=COLLECTIVE_TIMEOUT)


def test_every_case_is_checked(outs):
    from _agree_scenarios import CASES

    assert set(CASES) == set(EXPECTED) == set(outs[0]["cases"]["bad"])


@pytest.mark.parametrize("case", sorted(EXPECTED))
def test_bad_input_on_some_ranks_raises_on_every_rank_at_once(outs, case):
    cls, parts = EXPECTED[case]
    got = [o["cases"][case] for o in outs]
    nse0, nse2, nin2 = outs[0]["cases"]["nse"], outs[2]["cases"]["nse"], outs[2]["cases"]["n_in"]
    parts = [p.format(nse0=nse0, nse0p1=nse0 + 1, nse2=nse2, nse2m1=nse2 - 1, nse2m2=nse2 - 2, nin2=nin2, nin2m1=nin2 - 1)
             for p in parts]
    for r, g in enumerate(got):
        assert g is not None, f"{case}: rank {r} did not raise"
        name, message, seconds = g
        assert name == cls, f"{case}: rank {r} raised {name} after {seconds:.1f} s (not {cls}): {message[:400]}"
        assert seconds < PROMPT, f"{case}: rank {r} raised only after {seconds:.1f} s: {message[:400]}"
        for part in parts:
            assert part in message, f"{case}: rank {r}'s message lacks {part!r}: {message}"
    assert len({g[1] for g in got}) == 1, f"{case}: the ranks raised different messages: {[g[1] for g in got]}"
    bad = outs[0]["cases"]["bad"][case]
    assert all(f"rank {r}" in got[0][1] for r in bad), (bad, got[0][1])


def test_the_communicator_works_after_the_failures(outs):
    after = [o["cases"]["after"] for o in outs]
    assert all(isinstance(a, float) and a < 1e-9 for a in after), after


# --- writes into A.values when the values are summed from entries not in slot order --------------------------------
def _raised(got, part):
    assert isinstance(got, tuple) and len(got) == 3, f"expected an error, got {got!r}"
    name, message, seconds = got
    assert name == "InputError" and part in message, got
    assert seconds < PROMPT, got


def test_a_write_into_summed_values_is_used_until_the_entries_change_then_raises(outs):
    import torch

    for r, o in enumerate(outs):
        w = o["writes"]
        assert w["derived"], "the scenario must build values summed from entries"
        torch.testing.assert_close(w["written"], 2.0 * w["y0"])  # used while the entries are unchanged
        _raised(w["entries_changed"], f"rank {r}'s values were written in place")
        assert "those entries have changed since" in w["entries_changed"][1]
        torch.testing.assert_close(w["after_error"], w["y0"])  # then the entries' values again


def test_a_write_into_summed_values_raises_where_an_op_records_gradients(outs):
    import torch

    for o in outs:
        w = o["writes"]
        torch.testing.assert_close(w["written_no_grad"], 2.0 * w["y0"])
        _raised(w["grad_op"], "an op recording gradients of them")


def test_with_values_is_local_and_options_of_minus_zero_agree(outs):
    """A rank may call with_values alone (it communicates nothing: the ranks' next op pairs up as before; a
    collective with_values aborted gloo), and atol=-0.0 is the same option as 0.0 (its bits overflowed)."""
    import torch

    for r, o in enumerate(outs):
        w = o["writes"]
        torch.testing.assert_close(w["after_local"], w["y0"])
        assert ("local_diag" in w) == (r == 0)
        assert isinstance(w["neg_zero"], float) and w["neg_zero"] < 1e-9, w["neg_zero"]


def test_a_deferred_input_error_is_agreed_through_detach_and_is_symmetric(outs):
    """A wrong with_values on the last rank, used through detach() (as nonlinear_solve's Jacobian) or by
    is_symmetric: every rank raises the same InputError at once (it raised on that rank alone, the others
    waiting in the solve's collectives until the timeout); value batches (2, 3) and (3, 2) do not pair up."""
    for case, part in (("deferred_detach_solve", f"solve failed on rank {P - 1} (failing ranks: [{P - 1}])"),
                       ("deferred_is_symmetric", f"is_symmetric failed on rank {P - 1}")):
        got = [o["writes"][case] for o in outs]
        for g in got:
            _raised(g, part)
        assert len({g[1] for g in got}) == 1, got
    for o in outs:
        g = o["writes"]["batch_shapes"]
        assert isinstance(g, tuple) and g[0] == "MismatchError" and "A batch" in g[1], g


def test_a_write_on_one_rank_is_reported_on_every_rank(outs):
    got = [o["writes"]["one_rank"] for o in outs]
    for g in got:
        _raised(g, f"matmul failed on rank {P - 1} (failing ranks: [{P - 1}])")
    assert len({g[1] for g in got}) == 1
