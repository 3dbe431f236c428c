from harness import *

SA = "A = sla.SparseTensor(val, row, col, (n, n))\n"
TA = "A = st.SparseTensor.from_coo(val, row, col, shape=(n, n))\n"

# ---------------- construction
case("ctor SparseTensor(val,row,col,shape) same spelling", SA + "out = A.to_dense()", "A = st.SparseTensor(val, row, col, (n, n))\nout = A.to_dense()")
case("ctor: st from_coo(values,row,col,shape=)", SA + "out = A.to_dense()", TA + "out = A.to_dense()")
case("ctor: from_coo with positional shape", SA + "out = A.to_dense()", "A = st.SparseTensor.from_coo(val, row, col, (n, n))\nout = A.to_dense()")
case("ctor: from_coo w/o shape (inferred)", None, "A = st.SparseTensor.from_coo(val, row, col)\nout = A.shape")
case("ctor: keyword names values=,row_indices=,col_indices=,shape=",
     "A = sla.SparseTensor(values=val, row_indices=row, col_indices=col, shape=(n, n))\nout = A.to_dense()",
     "A = st.SparseTensor.from_coo(values=val, row_indices=row, col_indices=col, shape=(n, n))\nout = A.to_dense()")
case("ctor: int32 indices",
     "A = sla.SparseTensor(val, row.int(), col.int(), (n, n))\nout = A.solve(b)",
     "A = st.SparseTensor.from_coo(val, row.int(), col.int(), shape=(n, n))\nout = st.solve(A, b)")
case("ctor: float32 values, solve",
     "A = sla.SparseTensor(val.float(), row, col, (n, n))\nout = A.solve(b.float())",
     "A = st.SparseTensor.from_coo(val.float(), row, col, shape=(n, n))\nout = st.solve(A, b.float())")
case("ctor: duplicate entries -> to_dense sums",
     "A = sla.SparseTensor(torch.tensor([1.,2.,3.]).double(), torch.tensor([0,0,1]), torch.tensor([0,0,1]), (2,2))\nout = [A.to_dense(), torch.tensor(A.nnz)]",
     "A = st.SparseTensor.from_coo(torch.tensor([1.,2.,3.]).double(), torch.tensor([0,0,1]), torch.tensor([0,0,1]), shape=(2,2))\nout = [A.to_dense(), torch.tensor(A.nnz)]")
case("ctor: duplicate entries -> solve",
     "A = sla.SparseTensor(torch.tensor([1.,2.,3.]).double(), torch.tensor([0,0,1]), torch.tensor([0,0,1]), (2,2))\nout = A.solve(torch.ones(2).double())",
     "A = st.SparseTensor.from_coo(torch.tensor([1.,2.,3.]).double(), torch.tensor([0,0,1]), torch.tensor([0,0,1]), shape=(2,2))\nout = st.solve(A, torch.ones(2).double())")
case("ctor: out-of-range index",
     "A = sla.SparseTensor(val, row + 10, col, (n, n))\nout = A.to_dense()",
     "A = st.SparseTensor.from_coo(val, row + 10, col, shape=(n, n))\nout = A.to_dense()")
case("ctor: rectangular (n, n+2) @ x",
     "A = sla.SparseTensor(val, row, col, (n, n+2))\nout = A @ torch.ones(n+2).double()",
     "A = st.SparseTensor.from_coo(val, row, col, shape=(n, n+2))\nout = A @ torch.ones(n+2).double()")

# from dense
D = "D = torch.tensor([[2., 0., 1.], [0., 3., 0.], [1., 0., 4.]]).double()\n"
case("from_dense(D)", D + "A = sla.SparseTensor.from_dense(D)\nout = [A.to_dense(), torch.tensor(A.nnz)]",
     D + "A = st.SparseTensor.from_dense(D)\nout = [A.to_dense(), torch.tensor(A.nnz)]")
case("from_dense(D) keeps grad to D",
     D + "D.requires_grad_()\nA = sla.SparseTensor.from_dense(D)\n(A @ torch.ones(3).double()).sum().backward()\nout = D.grad",
     D + "D.requires_grad_()\nA = st.SparseTensor.from_dense(D)\n(A @ torch.ones(3).double()).sum().backward()\nout = D.grad")
DB = "DB = torch.stack([torch.tensor([[2., 0.], [0., 3.]]), torch.tensor([[2., 5.], [0., 3.]])]).double()\n"
case("from_dense batched (B,n,n), pattern differs per batch",
     DB + "A = sla.SparseTensor.from_dense(DB)\nout = A.to_dense()",
     DB + "A = st.SparseTensor.from_dense(DB)\nout = A.to_dense()")
case("from_dense batched (B,n,n), batch_dims=1",
     DB + "A = sla.SparseTensor.from_dense(DB)\nout = A.to_dense()",
     DB + "A = st.SparseTensor.from_dense(DB, batch_dims=1)\nout = [A.to_dense(), torch.tensor(list(A.shape))]")
case("from_dense batched shape/batch_shape",
     DB + "A = sla.SparseTensor.from_dense(DB)\nout = (tuple(A.shape), A.batch_shape, A.sparse_shape)",
     DB + "A = st.SparseTensor.from_dense(DB, batch_dims=1)\nout = (tuple(A.shape), A.batch_shape, A.format_shape)", cmp=False)

# scipy / torch.sparse
SC = "S = sp.random(8, 8, density=0.3, random_state=0, format='csr') + 8*sp.eye(8, format='csr')\n"
case("from scipy (sla: solve(scipy,b); st: from_package)",
     SC + "out = sla.solve(S, torch.ones(8).double())",
     SC + "A = st.from_package(S)\nout = st.solve(A, torch.ones(8).double())")
case("SparseTensor.from_scipy / from_package as classmethod",
     SC + "A = sla.SparseTensor.from_scipy(S)\nout = A.to_dense()",
     SC + "A = st.SparseTensor.from_package(S)\nout = A.to_dense()")
case("to scipy",
     SA + "out = torch.tensor(A.to_scipy().toarray())",
     TA + "out = torch.tensor(A.to_package('scipy').toarray())")
case("from_torch_sparse(coo)",
     "t = torch.tensor([[1.,0.],[2.,3.]]).double().to_sparse_coo()\nA = sla.SparseTensor.from_torch_sparse(t)\nout = A.to_dense()",
     "t = torch.tensor([[1.,0.],[2.,3.]]).double().to_sparse_coo()\nA = st.from_package(t)\nout = A.to_dense()")
case("from_torch_sparse(csr)",
     "t = torch.tensor([[1.,0.],[2.,3.]]).double().to_sparse_csr()\nA = sla.SparseTensor.from_torch_sparse(t)\nout = A.to_dense()",
     "t = torch.tensor([[1.,0.],[2.,3.]]).double().to_sparse_csr()\nA = st.from_package(t)\nout = A.to_dense()")
case("to_torch_sparse()", SA + "out = A.to_torch_sparse().to_dense()", TA + "out = A.to_package('torch').to_dense()")
case("to_csr()", SA + "out = A.to_csr().to_dense()", TA + "out = A.convert('CSR').to_dense()")
case("eye/diag/tridiagonal factories",
     "out = [sla.SparseTensor.eye(3).to_dense(), sla.SparseTensor.diag(torch.ones(3).double()).to_dense(), sla.SparseTensor.tridiagonal(4).to_dense()]",
     "out = [st.SparseTensor.eye(3).to_dense()]")

# batching
VB = "vb = torch.stack([val, 2*val])\n"
case("batched values ctor (B,n,n) + solve",
     VB + "A = sla.SparseTensor(vb, row, col, (2, n, n))\nout = A.solve(torch.stack([b, b]))",
     VB + "A = st.SparseTensor.from_coo(vb, row, col, shape=(2, n, n))\nout = st.solve(A, torch.stack([b, b]))")
case("batched values: @ x (B,n)",
     VB + "A = sla.SparseTensor(vb, row, col, (2, n, n))\nout = A @ torch.stack([b, b])",
     VB + "A = st.SparseTensor.from_coo(vb, row, col, shape=(2, n, n))\nout = A @ torch.stack([b, b])")
case("batched values: @ x unbatched (n,)",
     VB + "A = sla.SparseTensor(vb, row, col, (2, n, n))\nout = A @ b",
     VB + "A = st.SparseTensor.from_coo(vb, row, col, shape=(2, n, n))\nout = A @ b")
case("batched: A.batch_shape / batch_size / is_batched",
     VB + "A = sla.SparseTensor(vb, row, col, (2, n, n))\nout = (A.batch_shape, A.batch_size, A.is_batched)",
     VB + "A = st.SparseTensor.from_coo(vb, row, col, shape=(2, n, n))\nout = (A.batch_shape, A.batch_size, A.is_batched)", cmp=False)
case("multi-dim batch (2,3,n,n) solve",
     "vb = val.expand(2,3,-1).clone()\nA = sla.SparseTensor(vb, row, col, (2, 3, n, n))\nout = A.solve(b.expand(2,3,-1).clone())",
     "vb = val.expand(2,3,-1).clone()\nA = st.SparseTensor.from_coo(vb, row, col, shape=(2, 3, n, n))\nout = st.solve(A, b.expand(2,3,-1).clone())")
case("block values [nnz,K,K] ctor + to_dense",
     "vb = torch.randn(3,2,2).double()\nA = sla.SparseTensor(vb, torch.tensor([0,0,1]), torch.tensor([0,1,1]), (2,2,2,2))\nout = A.to_dense()",
     "vb = torch.randn(3,2,2).double()\nA = st.SparseTensor.from_coo(vb, torch.tensor([0,0,1]), torch.tensor([0,1,1]), shape=(2,2,2,2))\nout = A.to_dense()")

# properties
case(".shape type", SA + "out = A.shape", TA + "out = A.shape", cmp=False)
case(".nnz", SA + "out = A.nnz", TA + "out = A.nnz")
case(".values", SA + "out = A.values", TA + "out = A.values")
case(".row_indices/.col_indices", SA + "out = [A.row_indices, A.col_indices]", TA + "out = [A.row_indices, A.col_indices]")
case("coordinates (st spelling)", SA + "out = [A.row_indices, A.col_indices]", TA + "out = list(A.coordinates())")
case(".sparse_shape", SA + "out = A.sparse_shape", TA + "out = A.sparse_shape", cmp=False)
case(".is_cuda", SA + "out = A.is_cuda", TA + "out = A.is_cuda", cmp=False)
case(".is_square", SA + "out = A.is_square", TA + "out = A.is_square", cmp=False)
case(".ndim/.dtype/.device", SA + "out = (A.ndim, A.dtype, A.device)", TA + "out = (A.ndim, A.dtype, A.device)", cmp=False)
case("repr", SA + "out = repr(A)", TA + "out = repr(A)", cmp=False)
