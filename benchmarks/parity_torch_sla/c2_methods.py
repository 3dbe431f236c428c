from harness import *

SA = "A = sla.SparseTensor(val, row, col, (n, n))\nG = sla.SparseTensor(gval, row, col, (n, n))\n"
TA = "A = st.SparseTensor.from_coo(val, row, col, shape=(n, n))\nG = st.SparseTensor.from_coo(gval, row, col, shape=(n, n))\n"

# solve
case("A.solve(b) method", SA + "out = A.solve(b)", TA + "out = A.solve(b)")
case("solve: sla A.solve(b) vs st.solve(A,b)", SA + "out = A.solve(b)", TA + "out = st.solve(A, b)")
case("solve general (non-sym)", SA + "out = G.solve(b)", TA + "out = st.solve(G, b)")
case("solve multi-RHS (n,3)", SA + "out = A.solve(torch.stack([b, 2*b, -b], 1))", TA + "out = st.solve(A, torch.stack([b, 2*b, -b], 1))")
case("torch_sla.solve(A,b) top-level", SA + "out = sla.solve(A, b)", TA + "out = st.solve(A, b)")
case("spsolve(val,row,col,shape,b)", "out = sla.spsolve(val, row, col, (n, n), b)", "out = st.spsolve(val, row, col, (n, n), b)")
case("solve(A,b) with A=(val,row,col,shape) tuple", "out = sla.solve((val, row, col, (n, n)), b)", "out = st.solve((val, row, col, (n, n)), b)")
case("solve(dense A, b)", "out = sla.solve(torch.eye(n).double()*3, b)", "out = st.solve(torch.eye(n).double()*3, b)")
case("solve(scipy A, b) directly", "S = sp.eye(n, format='csr')*3\nout = sla.solve(S, b)", "S = sp.eye(n, format='csr')*3\nout = st.solve(S, b)")
case("solve b as (n,1)", SA + "out = A.solve(b[:, None])", TA + "out = st.solve(A, b[:, None])")

# matvec
case("A @ x", SA + "out = A @ b", TA + "out = A @ b")
case("A @ X (n,3)", SA + "out = A @ torch.ones(n, 3).double()", TA + "out = A @ torch.ones(n, 3).double()")
case("x @ A (rmatmul)", SA + "out = b @ A", TA + "out = b @ A")
case("A.matvec(x)", SA + "out = A.matvec(b)", TA + "out = A.matvec(b)")
case("torch.matmul(A, x)", SA + "out = torch.matmul(A, b)", TA + "out = torch.matmul(A, b)")
case("A @ A (sparse@sparse)", SA + "out = (A @ G).to_dense()", TA + "out = (A @ G).to_dense()")
case("A @ dense matrix (n,n) float32 mismatch dtype", SA + "out = A @ b.float()", TA + "out = A @ b.float()")

# transpose
case("A.T() (sla method)", SA + "out = G.T().to_dense()", TA + "out = G.T().to_dense()")
case("A.T property (st)", SA + "out = G.T.to_dense()", TA + "out = G.T.to_dense()")
case("A.T() @ x vs A.T @ x", SA + "out = G.T() @ b", TA + "out = G.T @ b")
case("A.H() / conj()", SA + "out = G.H().to_dense()", TA + "out = G.H().to_dense()")
case("A.t()", SA + "out = G.t().to_dense()", TA + "out = G.t().to_dense()")

# dense / detach / to
case("to_dense()", SA + "out = G.to_dense()", TA + "out = G.to_dense()")
case("detach()", "v = val.clone().requires_grad_()\nA = sla.SparseTensor(v, row, col, (n, n))\nout = (A.detach().requires_grad, A.requires_grad)",
     "v = val.clone().requires_grad_()\nA = st.SparseTensor.from_coo(v, row, col, shape=(n, n))\nout = (A.detach().requires_grad, A.requires_grad)", cmp=False)
case("clone()", SA + "out = A.clone().to_dense()", TA + "out = A.clone().to_dense()")
case("requires_grad_() then .grad", SA + "A.requires_grad_()\n(A @ b).sum().backward()\nout = A.grad",
     TA + "A.requires_grad_()\n(A @ b).sum().backward()\nout = A.values.grad")
case("A.grad attribute", SA + "A.requires_grad_()\n(A @ b).sum().backward()\nout = A.grad",
     TA + "A.requires_grad_()\n(A @ b).sum().backward()\nout = A.grad")
case(".to(dtype=float32)", SA + "out = A.to(dtype=torch.float32).dtype", TA + "out = A.to(dtype=torch.float32).dtype", cmp=False)
case(".to(torch.float32) positional", SA + "out = A.to(torch.float32).dtype", TA + "out = A.to(torch.float32).dtype", cmp=False)
case(".to('cpu')", SA + "out = A.to('cpu').to_dense()", TA + "out = A.to('cpu').to_dense()")
case(".to('cpu', torch.float32)", SA + "out = A.to('cpu', torch.float32).dtype", TA + "out = A.to('cpu', torch.float32).dtype", cmp=False)
case(".float()/.double()/.half()", SA + "out = (A.float().dtype, A.double().dtype, A.half().dtype)", TA + "out = (A.float().dtype, A.double().dtype, A.half().dtype)", cmp=False)
case(".cuda() (no GPU here)", SA + "out = A.cuda()", TA + "out = A.cuda()", cmp=False)
case(".cpu()", SA + "out = A.cpu().to_dense()", TA + "out = A.cpu().to_dense()")
case(".to(dtype) keeps grad", "v = val.clone().requires_grad_()\nA = sla.SparseTensor(v, row, col, (n, n))\n(A.to(dtype=torch.float32) @ b.float()).sum().backward()\nout = v.grad",
     "v = val.clone().requires_grad_()\nA = st.SparseTensor.from_coo(v, row, col, shape=(n, n))\n(A.to(dtype=torch.float32) @ b.float()).sum().backward()\nout = v.grad")

# arithmetic
case("A + A (same pattern)", SA + "out = (A + A).to_dense()", TA + "out = (A + A).to_dense()")
case("A + B (different pattern)", SA + "B = sla.SparseTensor.from_dense(torch.eye(n).double())\nout = (A + B).to_dense()", TA + "B = st.SparseTensor.from_dense(torch.eye(n).double())\nout = (A + B).to_dense()")
case("A - A", SA + "out = (A - G).to_dense()", TA + "out = (A - G).to_dense()")
case("2.0 * A", SA + "out = (2.0 * A).to_dense()", TA + "out = (2.0 * A).to_dense()")
case("A * 2.0", SA + "out = (A * 2.0).to_dense()", TA + "out = (A * 2.0).to_dense()")
case("A / 2", SA + "out = (A / 2).to_dense()", TA + "out = (A / 2).to_dense()")
case("-A", SA + "out = (-A).to_dense()", TA + "out = (-A).to_dense()")
case("A * A (Hadamard)", SA + "out = (A * G).to_dense()", TA + "out = (A * G).to_dense()")
case("A ** 2 (elementwise)", SA + "out = (G ** 2).to_dense()", TA + "out = (G ** 2).to_dense()")
case("A + 1.0 (scalar on stored entries)", SA + "out = (A + 1.0).to_dense()", TA + "out = (A + 1.0).to_dense()")
case("A * tensor scalar with grad", "s = torch.tensor(3.0, dtype=torch.float64, requires_grad=True)\n" + SA + "((s * A) @ b).sum().backward()\nout = s.grad",
     "s = torch.tensor(3.0, dtype=torch.float64, requires_grad=True)\n" + TA + "((s * A) @ b).sum().backward()\nout = s.grad")
case("st spelling of scalar mult: with_values", SA + "out = (2.0 * A).to_dense()", TA + "out = A.with_values(2.0 * A.values).to_dense()")
case("A.abs()/sqrt()/exp()", SA + "out = A.abs().to_dense()", TA + "out = A.abs().to_dense()")
case("A.sum()", SA + "out = A.sum()", TA + "out = A.sum()")
case("A.sum(axis=1) (row sums)", SA + "out = G.sum(axis=1)", TA + "out = G.sum(axis=1)")
case("A.mean()/max()/min()", SA + "out = [A.mean(), A.max(), A.min()]", TA + "out = [A.mean(), A.max(), A.min()]")

# indexing
case("A[0] indexing", SA + "out = A[0]", TA + "out = A[0]", cmp=False)
case("A[0, 1] element", SA + "out = A[0, 1]", TA + "out = A[0, 1]")
case("A.get_value((0,1)) (st)", SA + "out = A.to_dense()[0, 1]", TA + "out = A.get_value((0, 1))")
case("A[1:3] slicing", SA + "out = A[1:3]", TA + "out = A[1:3]", cmp=False)
case("batched A[0] -> member", "vb = torch.stack([val, 2*val])\nA = sla.SparseTensor(vb, row, col, (2, n, n))\nout = A[0]",
     "vb = torch.stack([val, 2*val])\nA = st.SparseTensor.from_coo(vb, row, col, shape=(n, n))\nout = A[0]", cmp=False)

# norm
for o in ["'fro'", "1", "2", "float('inf')"]:
    case(f"A.norm({o})", SA + f"out = G.norm({o})", TA + f"out = st.norm(G, {o})")
case("A.norm() method (st)", SA + "out = G.norm()", TA + "out = G.norm()")
case("dense reference norms ord=1,2,inf", None, "D = st.SparseTensor.from_coo(gval, row, col, shape=(n, n)).to_dense()\nout = [torch.linalg.matrix_norm(D, 1), torch.linalg.matrix_norm(D, 2), torch.linalg.matrix_norm(D, float('inf'))]", cmp=False)

# eigsh/eigs
case("A.eigsh(k=2) default which='LM'", SA + "out = A.eigsh(k=2)", TA + "out = st.eigsh(A, k=2)")
case("eigsh values only (sort)", SA + "out = A.eigsh(k=2)[0].sort().values", TA + "out = st.eigsh(A, k=2)[0].sort().values")
case("eigsh which='SA'", SA + "out = A.eigsh(k=2, which='SA')[0].sort().values", TA + "out = st.eigsh(A, k=2, which='SA')[0].sort().values")
case("eigsh which='SM'", SA + "out = A.eigsh(k=2, which='SM')[0].sort().values", TA + "out = st.eigsh(A, k=2, which='SM')[0].sort().values")
case("eigsh return_eigenvectors=False", SA + "out = A.eigsh(k=2, return_eigenvectors=False)", TA + "out = st.eigsh(A, k=2, return_eigenvectors=False)", cmp=False)
case("eigsh sigma=3.0", SA + "out = A.eigsh(k=2, sigma=3.0)[0].sort().values", TA + "out = st.eigsh(A, k=2, sigma=3.0)[0].sort().values")
case("A.eigsh method (st)", SA + "out = A.eigsh(k=2)[0]", TA + "out = A.eigsh(k=2)[0]")
case("eigs non-symmetric k=2", "Dd = torch.tensor([[1.,2.,0.],[3.,4.,0.],[0.,0.,0.5]]).double()\nA = sla.SparseTensor.from_dense(Dd)\nout = A.eigs(k=1)[0]",
     "Dd = torch.tensor([[1.,2.,0.],[3.,4.,0.],[0.,0.,0.5]]).double()\nA = st.SparseTensor.from_dense(Dd)\nout = st.eigs(A, k=1)[0]")
case("eigsh on batched", "vb = torch.stack([val, 2*val])\nA = sla.SparseTensor(vb, row, col, (2, n, n))\nout = A.eigsh(k=2, which='LA')[0]",
     "vb = torch.stack([val, 2*val])\nA = st.SparseTensor.from_coo(vb, row, col, shape=(n, n))\nout = st.eigsh(A, k=2, which='LA')[0]")

# det/logdet
case("A.det()", SA + "out = G.det()", TA + "out = st.det(G)")
case("A.det() method (st)", SA + "out = G.det()", TA + "out = G.det()")
case("A.logdet()", SA + "out = A.logdet()", TA + "out = st.logdet(A)")
case("logdet of non-SPD (neg det)", "Dd = torch.tensor([[0.,1.],[1.,0.]]).double()\nA = sla.SparseTensor.from_dense(Dd)\nout = A.logdet()",
     "Dd = torch.tensor([[0.,1.],[1.,0.]]).double()\nA = st.SparseTensor.from_dense(Dd)\nout = st.logdet(A)")
case("slogdet", None, TA + "out = st.slogdet(G)")
case("det batched", "vb = torch.stack([val, 2*val])\nA = sla.SparseTensor(vb, row, col, (2, n, n))\nout = A.det()",
     "vb = torch.stack([val, 2*val])\nA = st.SparseTensor.from_coo(vb, row, col, shape=(n, n))\nout = st.det(A)")

# misc linear algebra
case("A.is_symmetric()", SA + "out = (A.is_symmetric(), G.is_symmetric())", TA + "out = (A.is_symmetric(), G.is_symmetric())", cmp=False)
case("A.is_positive_definite()", SA + "out = A.is_positive_definite()", TA + "out = A.is_positive_definite()", cmp=False)
case("A.lu().solve(b)", SA + "out = G.lu().solve(b)", TA + "out = st.Solver(G, method='lu').solve(b)")
case("A.svd(k=2)", SA + "out = A.svd(k=2)[1]", TA + "out = st.svd(A, k=2)[1]")
case("A.condition_number()", SA + "out = A.condition_number()", TA + "out = st.cond(A)")
case("A.diag / diagonal()", SA + "out = A.diagonal()", TA + "out = A.diagonal()")
case("save/load", SA + "import tempfile, os\np = tempfile.mktemp(suffix='.safetensors')\nA.save(p)\nout = sla.SparseTensor.load(p).to_dense()",
     TA + "import tempfile\np = tempfile.mktemp()\ntorch.save(A, p)\nout = torch.load(p).to_dense()")
case("load_mtx / from_file", "import tempfile, scipy.io\np = tempfile.mktemp(suffix='.mtx')\nscipy.io.mmwrite(p, sp.eye(3)*2)\nout = sla.load_mtx(p).to_dense()",
     "import tempfile, scipy.io\np = tempfile.mktemp(suffix='.mtx')\nscipy.io.mmwrite(p, sp.eye(3)*2)\nout = st.SparseTensor.from_file(p).to_dense()")
