// Bindings for one scalar type (double); see bind.hpp.
#include "bind.hpp"

void register_f64(pybind11::module_& m) { ste::bind_scalar<double>(m, "f64"); }
