from harness import *

GS = "v = gval.clone().requires_grad_()\nbq = b.clone().requires_grad_()\n"
SA = GS + "A = sla.SparseTensor(v, row, col, (n, n))\n"
TA = GS + "A = st.SparseTensor.from_coo(v, row, col, shape=(n, n))\n"
SY = "v = val.clone().requires_grad_()\n"
SAs = SY + "A = sla.SparseTensor(v, row, col, (n, n))\n"
TAs = SY + "A = st.SparseTensor.from_coo(v, row, col, shape=(n, n))\n"
REF = "Dd = torch.zeros(n, n, dtype=torch.float64).index_put((row, col), v, accumulate=True)\n"

# ---- gradients
case("grad solve wrt values & b (default backend)", SA + "x = A.solve(bq)\n(x**2).sum().backward()\nout = [v.grad, bq.grad]",
     TA + "x = st.solve(A, bq)\n(x**2).sum().backward()\nout = [v.grad, bq.grad]")
case("grad solve vs dense reference (st)", GS + REF + "x = torch.linalg.solve(Dd, bq)\n(x**2).sum().backward()\nout = [v.grad, bq.grad]",
     TA + "x = st.solve(A, bq)\n(x**2).sum().backward()\nout = [v.grad, bq.grad]")
case("grad solve pytorch/cg nonsym -> bicgstab", SA + "x = A.solve(bq, backend='pytorch', method='bicgstab')\n(x**2).sum().backward()\nout = [v.grad, bq.grad]",
     TA + "x = st.solve(A, bq, method='bicgstab')\n(x**2).sum().backward()\nout = [v.grad, bq.grad]")
case("grad matvec", SA + "(A @ bq).pow(2).sum().backward()\nout = [v.grad, bq.grad]", TA + "(A @ bq).pow(2).sum().backward()\nout = [v.grad, bq.grad]")
case("grad A.T @ x", SA + "(A.T() @ bq).pow(2).sum().backward()\nout = [v.grad, bq.grad]", TA + "(A.T @ bq).pow(2).sum().backward()\nout = [v.grad, bq.grad]")
case("grad eigsh eigenvalues (sym)", SAs + "w, V = A.eigsh(k=2, which='LA')\nw.sum().backward()\nout = v.grad",
     TAs + "w, V = st.eigsh(A, k=2, which='LA')\nw.sum().backward()\nout = v.grad")
case("grad eigsh eigenvectors (sym)", SAs + "w, V = A.eigsh(k=1, which='LA')\n(V[:, 0]**4).sum().backward()\nout = v.grad",
     TAs + "w, V = st.eigsh(A, k=1, which='LA')\n(V[:, 0]**4).sum().backward()\nout = v.grad")
case("grad eigvec dense ref", SY + REF + "w, V = torch.linalg.eigh(Dd)\n(V[:, -1]**4).sum().backward()\nout = v.grad",
     TAs + "w, V = st.eigsh(A, k=1, which='LA')\n(V[:, 0]**4).sum().backward()\nout = v.grad")
case("grad det", SA + "A.det().backward()\nout = v.grad", TA + "st.det(A).backward()\nout = v.grad")
case("grad det dense ref", GS + REF + "torch.linalg.det(Dd).backward()\nout = v.grad", TA + "st.det(A).backward()\nout = v.grad")
case("grad logdet (SPD)", SAs + "A.logdet().backward()\nout = v.grad", TAs + "st.logdet(A).backward()\nout = v.grad")
case("grad logdet dense ref", SY + REF + "torch.logdet(Dd).backward()\nout = v.grad", TAs + "st.logdet(A).backward()\nout = v.grad")
case("grad norm fro", SA + "A.norm('fro').backward()\nout = v.grad", TA + "st.norm(A, 'fro').backward()\nout = v.grad")
case("double backward (grad of grad) solve", SA + "x = A.solve(bq)\ng, = torch.autograd.grad(x.sum(), bq, create_graph=True)\ng.sum().backward()\nout = v.grad",
     TA + "x = st.solve(A, bq)\ng, = torch.autograd.grad(x.sum(), bq, create_graph=True)\ng.sum().backward()\nout = v.grad")
case("torch.func.grad over solve", GS + "f = lambda bb: sla.SparseTensor(gval, row, col, (n, n)).solve(bb).pow(2).sum()\nout = torch.func.grad(f)(b)",
     GS + "A = st.SparseTensor.from_coo(gval, row, col, shape=(n, n))\nf = lambda bb: st.solve(A, bb).pow(2).sum()\nout = torch.func.grad(f)(b)")
case("gradcheck solve (values)", "vv = gval.clone().requires_grad_()\nout = torch.autograd.gradcheck(lambda q: sla.SparseTensor(q, row, col, (n, n)).solve(b), (vv,))",
     "vv = gval.clone().requires_grad_()\nout = torch.autograd.gradcheck(lambda q: st.solve(st.SparseTensor.from_coo(q, row, col, shape=(n, n)), b), (vv,))")
case("grad batched solve", "vb = torch.stack([val, 2*val]).requires_grad_()\nA = sla.SparseTensor(vb, row, col, (2, n, n))\nA.solve(torch.stack([b, b])).sum().backward()\nout = vb.grad",
     "vb = torch.stack([val, 2*val]).requires_grad_()\nA = st.SparseTensor.from_coo(vb, row, col, shape=(n, n))\nst.solve(A, torch.stack([b, b])).sum().backward()\nout = vb.grad")

# ---- SparseTensorList
L = "D1 = torch.tensor([[4., 1.], [1., 3.]]).double()\nD2 = torch.tensor([[5., 0., 1.], [0., 2., 0.], [1., 0., 6.]]).double()\n"
SL = L + "Lst = sla.SparseTensorList([sla.SparseTensor.from_dense(D1), sla.SparseTensor.from_dense(D2)])\n"
TL = L + "Lst = st.SparseTensorList([st.SparseTensor.from_dense(D1), st.SparseTensor.from_dense(D2)])\n"
BL = "bl = [torch.ones(2).double(), torch.ones(3).double()]\n"
case("SparseTensorList ctor + len/shapes", SL + "out = (len(Lst), Lst.shapes)", TL + "out = (len(Lst), Lst.shapes)", cmp=False)
case("SparseTensorList.solve(b_list)", SL + BL + "out = Lst.solve(bl)", TL + BL + "out = Lst.solve(bl)")
case("st.solve(list, b_list)", SL + BL + "out = Lst.solve(bl)", TL + BL + "out = st.solve(Lst, bl)")
case("SparseTensorList @ x_list", SL + BL + "out = Lst @ bl", TL + BL + "out = Lst @ bl")
case("SparseTensorList.det()", SL + "out = Lst.det()", TL + "out = Lst.det()")
case("st.det(list)", SL + "out = Lst.det()", TL + "out = st.det(Lst)")
case("SparseTensorList.eigsh(k=1)", SL + "out = [w for w, V in Lst.eigsh(k=1)]", TL + "out = [w for w, V in Lst.eigsh(k=1)]")
case("SparseTensorList.norm()", SL + "out = Lst.norm()", TL + "out = Lst.norm()")
case("SparseTensorList[i]", SL + "out = Lst[1].to_dense()", TL + "out = Lst[1].to_dense()")
case("SparseTensorList.to('cpu')", SL + "out = Lst.to('cpu')[0].to_dense()", TL + "out = Lst.to('cpu')[0].to_dense()")
case("SparseTensorList.to_block_diagonal()", SL + "out = Lst.to_block_diagonal().to_dense()", TL + "out = Lst.to_block_diagonal().to_dense()")
case("SparseTensorList.from_coo_list", L + "out = [t.to_dense() for t in sla.SparseTensorList.from_coo_list([(torch.tensor([1.,2.]).double(), torch.tensor([0,1]), torch.tensor([0,1]), (2,2))])]" if False else
     "out = [t.to_dense() for t in sla.SparseTensorList.from_coo_list([torch.tensor([1.,2.]).double()], [torch.tensor([0,1])], [torch.tensor([0,1])], [(2,2)])]",
     "out = [t.to_dense() for t in st.SparseTensorList.from_coo_list([torch.tensor([1.,2.]).double()], [torch.tensor([0,1])], [torch.tensor([0,1])], [(2,2)])]")
case("SparseTensorList grads through solve", L + BL + "a = D1.clone().requires_grad_()\nLst = sla.SparseTensorList([sla.SparseTensor.from_dense(a), sla.SparseTensor.from_dense(D2)])\nsum(x.sum() for x in Lst.solve(bl)).backward()\nout = a.grad",
     L + BL + "a = D1.clone().requires_grad_()\nLst = st.SparseTensorList([st.SparseTensor.from_dense(a), st.SparseTensor.from_dense(D2)])\nsum(x.sum() for x in st.solve(Lst, bl)).backward()\nout = a.grad")
case("SparseTensorList arithmetic 2*L", SL + "out = [t.to_dense() for t in (2 * Lst)]", TL + "out = [t.to_dense() for t in (2 * Lst)]")

# ---- batch helpers
case("spsolve_batch_same_layout", "vb = torch.stack([val, 2*val])\nout = sla.spsolve_batch_same_layout(vb, row, col, (n, n), torch.stack([b, b]))",
     "vb = torch.stack([val, 2*val])\nout = st.solve(st.SparseTensor.from_coo(vb, row, col, shape=(n, n)), torch.stack([b, b]))")
case("A_batch.solve_batch / solve for batch", "vb = torch.stack([val, 2*val])\nA = sla.SparseTensor(vb, row, col, (2, n, n))\nout = A.solve(torch.stack([b, b]))",
     "vb = torch.stack([val, 2*val])\nA = st.SparseTensor.from_coo(vb, row, col, shape=(n, n))\nout = st.solve(A, torch.stack([b, b]))")
case("batched A, single b (broadcast)", "vb = torch.stack([val, 2*val])\nA = sla.SparseTensor(vb, row, col, (2, n, n))\nout = A.solve(b)",
     "vb = torch.stack([val, 2*val])\nA = st.SparseTensor.from_coo(vb, row, col, shape=(n, n))\nout = st.solve(A, b)")
