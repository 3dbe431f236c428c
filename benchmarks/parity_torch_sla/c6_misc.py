from harness import *
SA = "A = sla.SparseTensor(val, row, col, (n, n))\n"
TA = "A = st.SparseTensor.from_coo(val, row, col, shape=(n, n))\n"
case("eigsh LA k=3 order (unsorted)", SA + "out = A.eigsh(k=3, which='LA')[0]", TA + "out = st.eigsh(A, k=3, which='LA')[0]")
case("eigsh LM k=3 order (unsorted)", SA + "out = A.eigsh(k=3)[0]", TA + "out = st.eigsh(A, k=3)[0]")
case("solve b dtype float32 vs A float64", SA + "out = A.solve(b.float())", TA + "out = st.solve(A, b.float())")
case("complex128 solve", "A = sla.SparseTensor(val.to(torch.complex128) * (1+0.5j), row, col, (n, n))\nout = A.solve(b.to(torch.complex128))",
     "A = st.SparseTensor.from_coo(val.to(torch.complex128) * (1+0.5j), row, col, shape=(n, n))\nout = st.solve(A, b.to(torch.complex128))")
case("SparseTensorList.cuda()/cpu()", "L = sla.SparseTensorList([sla.SparseTensor(val, row, col, (n, n))])\nout = L.cpu()[0].to_dense()",
     "L = st.SparseTensorList([st.SparseTensor.from_coo(val, row, col, shape=(n, n))])\nout = L.cpu()[0].to_dense()")
case("scalar-times-A with grad via with_values", "s = torch.tensor(3.0, dtype=torch.float64, requires_grad=True)\n" + SA + "(((s * A) @ b).sum()).backward()\nout = s.grad",
     "s = torch.tensor(3.0, dtype=torch.float64, requires_grad=True)\n" + TA + "((A.with_values(s * A.values) @ b).sum()).backward()\nout = s.grad")
case("A.values order vs input order (unsorted input)", SA + "out = A.values", TA + "out = A.values")
case("from_coo(check=False) keeps input order?", SA + "out = A.values", "A = st.SparseTensor.from_coo(val, row, col, shape=(n, n), check=False)\nout = A.values")
case("A.to_dense() batched full", "vb = torch.stack([val, 2*val])\nA = sla.SparseTensor(vb, row, col, (2, n, n))\nout = A.to_dense()",
     "vb = torch.stack([val, 2*val])\nA = st.SparseTensor.from_coo(vb, row, col, shape=(n, n))\nout = A.to_dense()")
case("logdet non-SPD value (det>0 nonsym)", "A = sla.SparseTensor(gval, row, col, (n, n))\nout = A.logdet()", "A = st.SparseTensor.from_coo(gval, row, col, shape=(n, n))\nout = st.logdet(A)")
case("logdet large Poisson (overflow)", "import scipy.sparse as sp\nm=40\nT=sp.diags([4*np.ones(m*m), -np.ones(m*m-1), -np.ones(m*m-1)], [0,-1,1]).tocoo()\nA = sla.SparseTensor(torch.tensor(T.data), torch.tensor(T.row).long(), torch.tensor(T.col).long(), (m*m, m*m))\nout = A.logdet()",
     "import scipy.sparse as sp\nm=40\nT=sp.diags([4*np.ones(m*m), -np.ones(m*m-1), -np.ones(m*m-1)], [0,-1,1]).tocoo()\nA = st.from_package(T)\nout = st.logdet(A)")
case("det large (overflow)", "import scipy.sparse as sp\nT=sp.diags([4*np.ones(1600), -np.ones(1599), -np.ones(1599)], [0,-1,1]).tocoo()\nA = sla.SparseTensor(torch.tensor(T.data), torch.tensor(T.row).long(), torch.tensor(T.col).long(), (1600, 1600))\nout = A.det()",
     "import scipy.sparse as sp\nT=sp.diags([4*np.ones(1600), -np.ones(1599), -np.ones(1599)], [0,-1,1]).tocoo()\nA = st.from_package(T)\nout = st.det(A)")
case("singular solve", "A = sla.SparseTensor(torch.tensor([1., 1.]).double(), torch.tensor([0, 1]), torch.tensor([0, 0]), (2, 2))\nout = A.solve(torch.ones(2).double())",
     "A = st.SparseTensor.from_coo(torch.tensor([1., 1.]).double(), torch.tensor([0, 1]), torch.tensor([0, 0]), shape=(2, 2))\nout = st.solve(A, torch.ones(2).double())")
case("Solver reuse: Solver(A).solve(b) twice", SA + "lu = A.lu()\nout = [lu.solve(b), lu.solve(2*b)]", TA + "S = st.Solver(A)\nout = [S.solve(b), S.solve(2*b)]")
