// Per-sample seeding of the global generators a Python __getitem__ draws from
// (seed_per_sample=True; python/stoker/loader/sample_seeding.py).
#pragma once

#include <pybind11/pybind11.h>

namespace stoker::python {

// stoker._stoker.configure_sample_seeding and seed_sample_generators.
void bind_seeding(pybind11::module_& m);

}  // namespace stoker::python
