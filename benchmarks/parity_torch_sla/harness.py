"""Run paired snippets in torch_sla and sparsetorch; report outcome and numeric agreement."""
import sys, traceback, warnings, io, contextlib, json
import torch, numpy as np, scipy.sparse as sp
import torch_sla as sla
import sparsetorch as st

warnings.filterwarnings("ignore")
torch.manual_seed(0)

n = 6
def base_ns():
    torch.manual_seed(0)
    idx = torch.arange(n)
    row = torch.cat([idx, idx[1:], idx[:-1]])
    col = torch.cat([idx, idx[:-1], idx[1:]])
    val = torch.cat([torch.full((n,), 4.0), torch.full((n - 1,), -1.0), torch.full((n - 1,), -1.0)]).double()
    # non-symmetric general matrix on the same pattern
    gval = val.clone(); gval[n:2 * n - 1] = -2.0
    b = torch.arange(1, n + 1, dtype=torch.float64)
    return dict(torch=torch, np=np, sp=sp, sla=sla, st=st, n=n, row=row, col=col, val=val, gval=gval, b=b)

RESULTS = []

def _summ(x):
    if isinstance(x, torch.Tensor):
        return f"Tensor{tuple(x.shape)} {x.dtype}"
    if isinstance(x, (tuple, list)):
        return type(x).__name__ + "[" + ", ".join(_summ(y) for y in x[:4]) + ("..." if len(x) > 4 else "") + "]"
    return type(x).__name__ + ("=" + repr(x)[:60] if isinstance(x, (int, float, bool, str, torch.Size)) else "")

def _flat(x):
    if isinstance(x, torch.Tensor):
        return [x.detach().to(torch.complex128) if x.is_complex() else x.detach().double()]
    if hasattr(x, "to_dense") and not isinstance(x, (list, tuple)):
        try:
            d = x.to_dense()
            return _flat(d)
        except Exception:
            return []
    if isinstance(x, (tuple, list)):
        out = []
        for y in x:
            out += _flat(y)
        return out
    if isinstance(x, (int, float, bool, np.floating)):
        return [torch.tensor(float(x), dtype=torch.float64)]
    return []

def _exec(code, ns):
    ns = dict(ns)
    buf = io.StringIO()
    try:
        with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
            exec(code, ns)
        return True, ns.get("out"), None
    except Exception as e:
        msg = f"{type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"
        return False, None, msg

def case(name, sla_code, st_code, cmp=True, note=""):
    ok1, r1, e1 = _exec(sla_code, base_ns()) if sla_code else (None, None, "n/a")
    ok2, r2, e2 = _exec(st_code, base_ns()) if st_code else (None, None, "n/a")
    diff = ""
    if ok1 and ok2 and cmp:
        f1, f2 = _flat(r1), _flat(r2)
        if len(f1) == len(f2) and f1:
            try:
                ds = []
                for a, c in zip(f1, f2):
                    if a.shape != c.shape:
                        ds.append(f"shape {tuple(a.shape)} vs {tuple(c.shape)}")
                    else:
                        den = max(float(a.abs().max()) if a.numel() else 0.0, 1e-300)
                        ds.append(f"{float((a - c).abs().max()) / den:.1e}" if a.numel() else "empty")
                diff = "reldiff " + ",".join(ds)
            except Exception as e:
                diff = f"cmp failed {e}"
        else:
            diff = f"cannot compare ({len(f1)} vs {len(f2)} tensors)"
    line = {
        "case": name,
        "sla": ("OK " + _summ(r1)) if ok1 else ("ERR " + str(e1)) if ok1 is False else "n/a",
        "st": ("OK " + _summ(r2)) if ok2 else ("ERR " + str(e2)) if ok2 is False else "n/a",
        "diff": diff, "note": note,
    }
    RESULTS.append(line)
    print(f"### {name}\n  sla: {line['sla']}\n  st : {line['st']}\n  {diff} {note}".rstrip(), flush=True)
