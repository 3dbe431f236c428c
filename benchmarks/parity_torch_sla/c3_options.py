from harness import *

# 2-D Poisson 8x8 (n=64) SPD; and a nonsymmetric convection-diffusion
PO = """
m = 8
N = m*m
T = sp.diags([2.0*np.ones(m), -np.ones(m-1), -np.ones(m-1)], [0, -1, 1])
K = (sp.kron(sp.eye(m), T) + sp.kron(T, sp.eye(m))).tocoo()
C = (K + sp.diags([0.3*np.ones(N-1)], [1])).tocoo()
r = torch.tensor(K.row).long(); c = torch.tensor(K.col).long(); v = torch.tensor(K.data)
rc = torch.tensor(C.row).long(); cc = torch.tensor(C.col).long(); vc = torch.tensor(C.data)
bb = torch.linspace(-1, 1, N, dtype=torch.float64)
"""
SA = PO + "A = sla.SparseTensor(v, r, c, (N, N))\nCA = sla.SparseTensor(vc, rc, cc, (N, N))\n"
TA = PO + "A = st.SparseTensor.from_coo(v, r, c, shape=(N, N))\nCA = st.SparseTensor.from_coo(vc, rc, cc, shape=(N, N))\n"

# backend names
for be_sla, be_st in [("'auto'", "'auto'"), ("'auto'", "None"), ("'scipy'", "'scipy'"), ("'pytorch'", "'pytorch'"), ("'pytorch'", "'torch'"),
                      ("'cudss'", "'cudss'"), ("'pyamg'", "'pyamg'"), ("'eigen'", "'eigen'")]:
    case(f"backend= {be_sla} / {be_st}", SA + f"out = A.solve(bb, backend={be_sla})", TA + f"out = st.solve(A, bb, backend={be_st})")

# method names
for meth, be in [("lu", "scipy"), ("cholesky", "cudss"), ("ldlt", "cudss"), ("umfpack", "scipy"), ("cg", "pytorch"), ("cg", "scipy"), ("bicgstab", "pytorch"),
                 ("bicgstab", "scipy"), ("gmres", "pytorch"), ("gmres", "scipy"), ("lgmres", "scipy"), ("minres", "pytorch"), ("minres", "scipy"), ("qmr", "scipy"),
                 ("lsqr", "pytorch"), ("lsmr", "pytorch"), ("amg", "pyamg"), ("ruge_stuben", "pyamg"), ("smoothed_aggregation", "pyamg"), ("sa", "pyamg")]:
    case(f"method='{meth}' (sla backend {be}; st method only)", SA + f"out = sla.spsolve(v, r, c, (N, N), bb, backend='{be}', method='{meth}')",
         TA + f"out = st.solve(A, bb, method='{meth}')")
# combined method names ('cudss_lu' etc)
case("combined method 'scipy_lu'", SA + "out = A.solve(bb, method='scipy_lu')", TA + "out = st.solve(A, bb, method='scipy_lu')")

# tolerances
case("tol= (sla: unused direct tol) ", SA + "out = A.solve(bb, backend='pytorch', method='cg', tol=1e-3)", TA + "out = st.solve(A, bb, method='cg', tol=1e-3)")
case("atol=1e-3 absolute", SA + "x = A.solve(bb, backend='pytorch', method='cg', atol=1e-3)\nout = (A @ x - bb).norm()",
     TA + "x = st.solve(A, bb, method='cg', atol=1e-3, rtol=0)\nout = (A @ x - bb).norm()", cmp=False)
case("atol=1e-3 (st default rtol)", SA + "x = A.solve(bb, backend='pytorch', method='cg', atol=1e-3)\nout = (A @ x - bb).norm()",
     TA + "x = st.solve(A, bb, method='cg', atol=1e-3)\nout = (A @ x - bb).norm()", cmp=False)
case("rtol=1e-4 (sla.solve)", SA + "x = sla.solve(A, bb, backend='pytorch', method='cg', rtol=1e-4)\nout = (A @ x - bb).norm() / bb.norm()",
     TA + "x = st.solve(A, bb, method='cg', rtol=1e-4)\nout = (A @ x - bb).norm() / bb.norm()", cmp=False)
case("default accuracy CG (relres)", SA + "x = A.solve(bb, backend='pytorch', method='cg')\nout = (A @ x - bb).norm() / bb.norm()",
     TA + "x = st.solve(A, bb, method='cg')\nout = (A @ x - bb).norm() / bb.norm()", cmp=False)
case("default accuracy scipy cg (relres)", SA + "x = A.solve(bb, backend='scipy', method='cg')\nout = (A @ x - bb).norm() / bb.norm()",
     TA + "x = st.solve(A, bb, backend='scipy', method='cg')\nout = (A @ x - bb).norm() / bb.norm()", cmp=False)
case("maxiter=5 (non-convergence)", SA + "x = A.solve(bb, backend='pytorch', method='cg', maxiter=5)\nout = (A @ x - bb).norm() / bb.norm()",
     TA + "x = st.solve(A, bb, method='cg', maxiter=5)\nout = (A @ x - bb).norm() / bb.norm()", cmp=False)
case("maxiter=5 on_nonconvergence='ignore'", SA + "x = A.solve(bb, backend='pytorch', method='cg', maxiter=5)\nout = x",
     TA + "x = st.solve(A, bb, method='cg', maxiter=5, on_nonconvergence='ignore')\nout = x")
case("max_iter= spelling", SA + "out = sla.solve(A, bb, max_iter=50)", TA + "out = st.solve(A, bb, max_iter=50)")
case("x0= initial guess", SA + "out = sla.solve(A, bb, method='cg', backend='pytorch', x0=torch.zeros(N).double())",
     TA + "out = st.solve(A, bb, method='cg', x0=torch.zeros(N).double())")
case("verbose=True", SA + "out = A.solve(bb, verbose=True)", TA + "out = st.solve(A, bb, verbose=True)")
case("restart= gmres", SA + "out = sla.solve(CA, bb, backend='pytorch', method='gmres', restart=20)", TA + "out = st.solve(CA, bb, method='gmres', restart=20)")
case("matrix_type='spd' / properties='spd'", SA + "out = sla.solve(A, bb, matrix_type='spd')", TA + "out = st.solve(A, bb, properties='spd')")
case("matrix_type= spelling in st", SA + "out = sla.solve(A, bb, matrix_type='spd')", TA + "out = st.solve(A, bb, matrix_type='spd')")
case("spsolve is_spd=True", "out = 0", TA + "out = st.solve(A, bb, is_spd=True)", cmp=False)
case("mixed_precision=True", SA + "out = sla.solve(A, bb, backend='pytorch', method='cg', mixed_precision=True)", TA + "out = st.solve(A, bb, method='cg', mixed_precision=True)")

# preconditioners
for pre in ["jacobi", "none", "ssor", "block_jacobi", "polynomial", "ic0", "ilu", "ilu0", "asm", "amg", "pyamg", "auto"]:
    case(f"preconditioner='{pre}' cg", SA + f"x = A.solve(bb, backend='pytorch', method='cg', preconditioner='{pre}') if hasattr(A, 'solve') else None\nx = sla.spsolve(v, r, c, (N, N), bb, backend='pytorch', method='cg', preconditioner='{pre}')\nout = x",
         TA + f"out = st.solve(A, bb, method='cg', preconditioner='{pre}')")
case("preconditioner=None (both)", SA + "out = sla.solve(A, bb, backend='pytorch', method='cg', preconditioner=None)", TA + "out = st.solve(A, bb, method='cg', preconditioner=None)")
case("preconditioner=callable", SA + "d = torch.tensor(K.diagonal())\nout = sla.solve(A, bb, backend='pytorch', method='cg', preconditioner=lambda x: x / d)",
     TA + "d = torch.tensor(K.diagonal())\nout = st.solve(A, bb, method='cg', preconditioner=lambda x: x / (d if x.dim()==1 else d[:, None]))")
case("preconditioner='ilu' with gmres", SA + "out = sla.spsolve(vc, rc, cc, (N, N), bb, backend='pytorch', method='gmres', preconditioner='ilu')",
     TA + "out = st.solve(CA, bb, method='gmres', preconditioner='ilu')")
case("A.solve(..., preconditioner=) method kwarg", SA + "out = A.solve(bb, preconditioner='jacobi')", TA + "out = st.solve(A, bb, preconditioner='jacobi')")

# info / config
case("return_info=True", SA + "x, info = sla.solve(A, bb, return_info=True)\nout = (type(info).__name__, sorted(k for k in vars(info)) if hasattr(info, '__dict__') else str(info))",
     TA + "x, info = st.solve(A, bb, return_info=True)\nout = (type(info).__name__, [f for f in info.__dataclass_fields__] if hasattr(info, '__dataclass_fields__') else dir(info))", cmp=False)
case("info iterations (cg)", SA + "x, info = sla.solve(A, bb, backend='pytorch', method='cg', return_info=True)\nout = (info.iter_count if hasattr(info,'iter_count') else info.iterations, info.backend, info.method)",
     TA + "x, info = st.solve(A, bb, method='cg', return_info=True)\nout = (info.iterations, info.backend, info.method)", cmp=False)
case("SolverConfig context", SA + "with sla.SolverConfig(method='cg', backend='pytorch'):\n    out = sla.solve(A, bb)", TA + "with st.SolverConfig(method='cg'):\n    out = st.solve(A, bb)")
case("SolverConfig.spd() preset", SA + "out = sla.solve(A, bb, config=sla.SolverConfig.spd()) if False else sla.SolverConfig.spd()", TA + "out = st.SolverConfig.spd()", cmp=False)
case("get_available_backends()/show_backends", "out = sla.get_available_backends()", "out = [b.name for b in st.registry()] if callable(st.registry) else st.registry", cmp=False)
case("explain (st only)", None, TA + "out = str(st.explain('solve', A, bb))[:200]", cmp=False)
