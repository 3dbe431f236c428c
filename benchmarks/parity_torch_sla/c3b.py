from harness import *
exec(open('c3_options.py').read().split('# backend names')[0].split('from harness import *')[1])
globals().update(base_ns())
ns = {}
exec(PO, globals())
A = sla.SparseTensor(v, r, c, (N, N)); TA_ = st.SparseTensor.from_coo(v, r, c, shape=(N, N))
def rr(x, M=A): return float((M @ x - bb).norm() / bb.norm())
print("atol=1e-3 sla pytorch cg relres", rr(A.solve(bb, backend='pytorch', method='cg', atol=1e-3)))
print("atol=1e-3 st cg (rtol default) relres", rr(st.solve(TA_, bb, method='cg', atol=1e-3)))
print("atol=1e-3 rtol=0 st relres", rr(st.solve(TA_, bb, method='cg', atol=1e-3, rtol=0)))
print("rtol=1e-4 sla.solve relres", rr(sla.solve(A, bb, backend='pytorch', method='cg', rtol=1e-4)))
print("rtol=1e-4 st relres", rr(st.solve(TA_, bb, method='cg', rtol=1e-4)))
print("default sla pytorch cg", rr(A.solve(bb, backend='pytorch', method='cg')))
print("default sla scipy cg", rr(A.solve(bb, backend='scipy', method='cg')))
print("default sla scipy gmres", rr(A.solve(bb, backend='scipy', method='gmres')))
print("default st scipy cg", rr(st.solve(TA_, bb, backend='scipy', method='cg')))
print("maxiter=5 sla (silent)", rr(A.solve(bb, backend='pytorch', method='cg', maxiter=5)))
x = st.solve(TA_, bb, method='cg', maxiter=5, on_nonconvergence='ignore'); print("maxiter=5 st ignore", rr(x))
x, info = st.solve(TA_, bb, method='cg', return_info=True); print("st info", info)
x, info = sla.solve(A, bb, backend='pytorch', method='cg', return_info=True); print("sla info", info)
for pre in ["jacobi","none","ssor","block_jacobi","polynomial","ic0","ilu","ilu0","asm","amg","pyamg","auto"]:
    try:
        x = sla.spsolve(v, r, c, (N, N), bb, backend='pytorch', method='cg', preconditioner=pre); s1 = f"ok relres {rr(x):.1e}"
    except Exception as e: s1 = f"ERR {type(e).__name__}: {str(e)[:80]}"
    try:
        x = st.solve(TA_, bb, method='cg', preconditioner=pre); s2 = f"ok relres {rr(x):.1e}"
    except Exception as e: s2 = f"ERR {type(e).__name__}: {str(e)[:60]}"
    try:
        x = st.solve(TA_, bb, method='gmres', preconditioner=pre); s3 = f"ok relres {rr(x):.1e}"
    except Exception as e: s3 = f"ERR {type(e).__name__}"
    print(f"pre={pre:13s} sla: {s1} | st cg: {s2} | st gmres: {s3}")
print(st.registry())
