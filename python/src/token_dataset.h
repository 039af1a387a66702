// stoker.TokenDataset's C++ side (include/stoker/tokens.h): token files packed into rows.
#pragma once

#include <pybind11/pybind11.h>

namespace stoker::python {

// Adds token_rows() (a NativeDataset over stoker::TokenRows, its files opened and its rows
// planned with the GIL released), token_plan() (plan_rows on given lengths) and the functions
// that read a TokenRows' corpus and plan.
void bind_tokens(pybind11::module_& m);

}  // namespace stoker::python
