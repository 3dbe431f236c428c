from harness import *

# Problem: K u + 0.1 u^3 = f, K SPD tridiagonal (n=6); param f (requires grad) and c
P = """
f = torch.linspace(1, 2, n, dtype=torch.float64).requires_grad_()
cc = torch.tensor(0.1, dtype=torch.float64, requires_grad=True)
u0 = torch.zeros(n, dtype=torch.float64)
Kd = torch.zeros(n, n, dtype=torch.float64).index_put((row, col), val, accumulate=True)
"""
FD = "def F(u, f, cc):\n    return Kd @ u + cc * u**3 - f\n"
FS_sla = "KA = sla.SparseTensor(val, row, col, (n, n))\ndef F(u, f, cc):\n    return KA @ u + cc * u**3 - f\n"
FS_st = "KA = st.SparseTensor.from_coo(val, row, col, shape=(n, n))\ndef F(u, f, cc):\n    return KA @ u + cc * u**3 - f\n"
BK = "(u**2).sum().backward()\nout = [u, f.grad, cc.grad]"

case("nonlinear_solve(F,u0,*params) varargs vs tuple", P + FD + "u = sla.nonlinear_solve(F, u0, f, cc)\n" + BK,
     P + FD + "u = st.nonlinear_solve(F, u0, (f, cc))\n" + BK)
case("nonlinear_solve same call spelling (varargs) in st", P + FD + "u = sla.nonlinear_solve(F, u0, f, cc)\n" + BK,
     P + FD + "u = st.nonlinear_solve(F, u0, f, cc)\n" + BK)
case("nonlinear_solve residual uses SparseTensor @", P + FS_sla + "u = sla.nonlinear_solve(F, u0, f, cc)\n" + BK,
     P + FS_st + "u = st.nonlinear_solve(F, u0, (f, cc))\n" + BK)
case("method='newton' tol= max_iter=", P + FD + "u = sla.nonlinear_solve(F, u0, f, cc, method='newton', tol=1e-10, max_iter=30)\n" + BK,
     P + FD + "u = st.nonlinear_solve(F, u0, (f, cc), method='newton', tol=1e-10, max_iter=30)\n" + BK)
case("st spelling rtol= maxiter=", P + FD + "u = sla.nonlinear_solve(F, u0, f, cc, method='newton', tol=1e-10, max_iter=30)\n" + BK,
     P + FD + "u = st.nonlinear_solve(F, u0, (f, cc), method='newton', rtol=1e-10, maxiter=30)\n" + BK)
for m in ["picard", "anderson"]:
    case(f"method='{m}'", P + FD + f"u = sla.nonlinear_solve(F, u0, f, cc, method='{m}')\n" + BK,
         P + FD + f"u = st.nonlinear_solve(F, u0, (f, cc), method='{m}')\n" + BK)
JF_sla = "def J(u, f, cc):\n    d = 3 * cc * u**2\n    idx = torch.arange(n)\n    return (torch.cat([val, d.detach()]), torch.cat([row, idx]), torch.cat([col, idx]), (n, n))\n"
JF_st = "def J(u, f, cc):\n    d = 3 * cc * u**2\n    idx = torch.arange(n)\n    return st.SparseTensor.from_coo(torch.cat([val, d.detach()]), torch.cat([row, idx]), torch.cat([col, idx]), shape=(n, n))\n"
case("jacobian_fn= (sla COO tuple) / jacobian= (st SparseTensor)", P + FD + JF_sla + "u = sla.nonlinear_solve(F, u0, f, cc, jacobian_fn=J)\n" + BK,
     P + FD + JF_st + "u = st.nonlinear_solve(F, u0, (f, cc), jacobian=J)\n" + BK)
case("jacobian_fn= spelling in st", P + FD + JF_sla + "u = sla.nonlinear_solve(F, u0, f, cc, jacobian_fn=J)\n" + BK,
     P + FD + JF_sla + "u = st.nonlinear_solve(F, u0, (f, cc), jacobian_fn=J)\n" + BK)
case("linear_solver=/linear_method= (sla) vs linear_options (st)", P + FD + "u = sla.nonlinear_solve(F, u0, f, cc, linear_solver='scipy', linear_method='lu')\n" + BK,
     P + FD + "u = st.nonlinear_solve(F, u0, (f, cc), linear_options={'backend': 'scipy', 'method': 'lu'})\n" + BK)
case("SparseTensor.nonlinear_solve (A passed to F)", P + "KA = sla.SparseTensor(val, row, col, (n, n))\ndef G(u, A, f, cc):\n    return A @ u + cc * u**3 - f\nu = KA.nonlinear_solve(G, u0, f, cc)\n" + BK,
     P + "KA = st.SparseTensor.from_coo(val, row, col, shape=(n, n))\ndef G(u, A, f, cc):\n    return A @ u + cc * u**3 - f\nu = st.nonlinear_solve(G, u0, (KA, f, cc))\n" + BK)
case("grad wrt SparseTensor values in nonlinear", P + "vv = val.clone().requires_grad_()\nKA = sla.SparseTensor(vv, row, col, (n, n))\ndef G(u, A, f, cc):\n    return A @ u + cc * u**3 - f\nu = KA.nonlinear_solve(G, u0, f, cc)\n(u**2).sum().backward()\nout = vv.grad",
     P + "vv = val.clone().requires_grad_()\nKA = st.SparseTensor.from_coo(vv, row, col, shape=(n, n))\ndef G(u, A, f, cc):\n    return A @ u + cc * u**3 - f\nu = st.nonlinear_solve(G, u0, (KA, f, cc))\n(u**2).sum().backward()\nout = vv.grad")
case("adjoint_solve alias", P + FD + "u = sla.adjoint_solve(F, u0, f, cc)\n" + BK, P + FD + "u = st.adjoint_solve(F, u0, (f, cc))\n" + BK)
case("vi_solve (box constraints)", P + FD + "u = sla.vi_solve(F, u0, f, cc, lower=torch.zeros(n).double(), upper=0.3*torch.ones(n).double())\nout = u",
     P + FD + "u = st.vi_solve(F, u0, (f, cc), lower=torch.zeros(n).double(), upper=0.3*torch.ones(n).double())\nout = u")
# non-symmetric Jacobian (JFNK transpose bug in sla)
PN = P + "Kd = Kd + torch.diag(torch.full((n-1,), 1.5, dtype=torch.float64), 1)\n"
case("Newton w/o jacobian, non-symmetric J", PN + FD + "u = sla.nonlinear_solve(F, u0, f, cc)\nout = [u, F(u, f, cc).norm()]",
     PN + FD + "u = st.nonlinear_solve(F, u0, (f, cc))\nout = [u, F(u, f, cc).norm()]")
case("return_info=True", P + FD + "out = sla.nonlinear_solve(F, u0, f, cc, return_info=True)",
     P + FD + "u, info = st.nonlinear_solve(F, u0, (f, cc), return_info=True)\nout = (info.iterations, info.method)", cmp=False)
