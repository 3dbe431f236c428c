// Bindings for one scalar type (std::complex<float>); see bind.hpp.
#include "bind.hpp"

void register_c64(pybind11::module_& m) { ste::bind_scalar<std::complex<float>>(m, "c64"); }
