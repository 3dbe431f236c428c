import torch
from sparsetorch_cuda.launch import kernel
for name in ("delta_tc8pkb_b4", "delta_tc8pkbf_b4", "delta_tc8pkb2_b4", "delta_tc8pkb2f_b4", "delta_tc8pkb3_b4", "delta_tc8pkb4_b4"):
    k = kernel("delta", name, torch.float16, torch.int32, 0, 9)
    cu = k._cu
    r = cu.cuFuncGetAttribute(cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_NUM_REGS, k._fn)
    l = cu.cuFuncGetAttribute(cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES, k._fn)
    print(name, "regs", r[1], "local bytes", l[1])
