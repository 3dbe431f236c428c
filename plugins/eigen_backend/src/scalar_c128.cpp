// Bindings for one scalar type (std::complex<double>); see bind.hpp.
#include "bind.hpp"

void register_c128(pybind11::module_& m) { ste::bind_scalar<std::complex<double>>(m, "c128"); }
