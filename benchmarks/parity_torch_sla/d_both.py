import os, sys, torch, warnings, traceback
warnings.filterwarnings("ignore")
import torch.distributed as dist
which = sys.argv[1]
m = 6; N = m*m
import scipy.sparse as sp, numpy as np
T = sp.diags([2.0*np.ones(m), -np.ones(m-1), -np.ones(m-1)], [0, -1, 1])
K = (sp.kron(sp.eye(m), T) + sp.kron(T, sp.eye(m))).tocoo()
r = torch.tensor(K.row).long(); c = torch.tensor(K.col).long(); v = torch.tensor(K.data)
bg = torch.linspace(-1, 1, N, dtype=torch.float64)
xref = torch.linalg.solve(torch.tensor(K.toarray()), bg)
def rep(tag, f):
    try:
        out = f()
        print(f"[{which} rank{dist.get_rank()}] {tag}: OK {out}", flush=True)
    except Exception as e:
        print(f"[{which} rank{dist.get_rank()}] {tag}: ERR {type(e).__name__}: {str(e).splitlines()[0][:150]}", flush=True)

if which == "sla":
    dist.init_process_group("gloo")
    import torch_sla as sla
    from torch.distributed.device_mesh import init_device_mesh
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    A = sla.SparseTensor(v, r, c, (N, N))
    D = sla.DSparseTensor.partition(A, mesh)
    def s1():
        bd = D.scatter(bg); x = D.solve(bd); xf = x.full_tensor(); return f"maxerr {float((xf - xref).abs().max()):.1e}"
    rep("D=DSparseTensor.partition(A,mesh); D.solve(D.scatter(b))", s1)
    def s2():
        y = (D @ D.scatter(bg)).full_tensor(); return f"maxerr {float((y - torch.tensor(K @ bg.numpy())).abs().max()):.1e}"
    rep("D @ x", s2)
    def s3():
        D2 = sla.DSparseTensor.partition(sla.SparseTensor(v, r, c, (N, N)), mesh)
        bq = bg.clone().requires_grad_(); x = D2.solve(D2.scatter(bq)); x.full_tensor().sum().backward(); return f"grad norm {float(bq.grad.norm()):.3e}"
    rep("grad through D.solve wrt b", s3)
    def s4():
        vq = v.clone().requires_grad_(); D3 = sla.DSparseTensor.partition(sla.SparseTensor(vq, r, c, (N, N)), mesh)
        x = D3.solve(D3.scatter(bg)); x.full_tensor().sum().backward(); return f"grad norm {float(vq.grad.norm()):.3e}"
    rep("grad through D.solve wrt values", s4)
    rep("D.eigsh(k=2, which='LA')", lambda: D.eigsh(k=2, which="LA")[0])
    rep("sla.DSparseTensorList", lambda: sla.DSparseTensorList)
    rep("sla.solve(D, b) top-level", lambda: f"{type(sla.solve(D, D.scatter(bg))).__name__}")
else:
    import sparsetorch as st, sparsetorch_distributed as sd
    comm = sd.init()
    A = st.SparseTensor.from_coo(v, r, c, shape=(N, N))
    rank = dist.get_rank()
    D = sd.DSparseTensor.scatter(A if rank == 0 else None, src=0)
    own = D.owned_rows()
    def s1():
        x = sd.solve(D, bg[own]); return f"maxerr {float((x - xref[own]).abs().max()):.1e}"
    rep("D=DSparseTensor.scatter(A,src=0); sd.solve(D, b[owned])", s1)
    rep("D.solve(b) method", lambda: D.solve(bg[own]))
    def s2():
        y = D @ bg[own]; return f"maxerr {float((y - torch.tensor(K @ bg.numpy())[own]).abs().max()):.1e}"
    rep("D @ x", s2)
    def s3():
        bq = bg[own].clone().requires_grad_(); x = sd.solve(D, bq); loss = sd.global_sum(x.sum(), comm); loss.backward(); return f"grad norm(local) {float(bq.grad.norm()):.3e}"
    rep("grad through sd.solve wrt b", s3)
    def s4():
        vq = v.clone().requires_grad_(); D3 = sd.DSparseTensor.scatter(st.SparseTensor.from_coo(vq, r, c, shape=(N, N)) if rank == 0 else None, src=0)
        x = sd.solve(D3, bg[own]); sd.global_sum(x.sum(), comm).backward(); return f"grad norm {float(vq.grad.norm()) if vq.grad is not None else None}"
    rep("grad through sd.solve wrt values", s4)
    rep("sd.eigsh(D, k=2, which='LA')", lambda: sd.eigsh(D, k=2, which="LA")[0])
    rep("sd.DSparseTensorList", lambda: sd.DSparseTensorList)
    rep("DSparseTensor.partition(A, mesh) spelling", lambda: sd.DSparseTensor.partition(A, None))
    rep("st.solve(D, b) top-level", lambda: st.solve(D, bg[own]))
    rep("D.scatter(global_vec) (sla meaning)", lambda: D.scatter(bg))
dist.destroy_process_group()
