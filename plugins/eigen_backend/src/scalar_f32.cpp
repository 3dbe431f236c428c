// Bindings for one scalar type (float); see bind.hpp.
#include "bind.hpp"

void register_f32(pybind11::module_& m) { ste::bind_scalar<float>(m, "f32"); }
