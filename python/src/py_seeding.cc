// Per-sample seeding of the global generators a Python __getitem__ draws from.
//
// Seeding a Mersenne twister the usual way (random.seed, numpy.random.seed) runs its 624-word
// initialisation, a chain of dependent multiplies, behind a Python call: 3-6 us a generator, a
// quarter of a cheap __getitem__'s time. Here random's and numpy's legacy twisters get their
// 624 words from SplitMix64 (independent steps) written in place as the twister's next
// outputs (position 0: its next 624 draws temper them, and only then does it regenerate, so
// a sample that draws a few numbers pays no regeneration, which after a seed() costs about a
// microsecond at the first draw), and their cached normal deviate dropped, as their seed()
// does. The addresses are found and checked in Python (sample_seeding.py: the words read in
// place equal getstate()'s after a seed, or that generator is seeded through its seed()).
// torch's generator's state is not reachable, but its set_state() (0.3 us) takes a state
// tensor in the layout get_state() gives (CPUGeneratorImplState: the legacy struct of the
// seed, the twister's position, its 624 words as 64-bit values and the cached normal
// deviates, then the cached float deviate): its words are written into a tensor kept for it,
// taken as its next outputs likewise (623 of them: the count left set to 624), the caches
// dropped, and set_state() called;
// manual_seed() (1.7 us: the twister's serial initialisation) where the layout's check
// fails.
//
// Thread safety: called with the GIL held, which guards the generators.
#include "py_seeding.h"

#include <pybind11/stl.h>

#include <cstddef>
#include <cstdint>
#include <optional>

#include "py_dataset.h"

namespace stoker::python {
namespace {

namespace py = pybind11;

constexpr std::size_t kTwisterWords = 624;

// One Mersenne twister's state in place: its words, its position (the next draw takes the
// word there; it regenerates the words at 624), and a cached normal deviate to drop (numpy's
// has_gauss; random's gauss_next is an attribute, set from Python's side of the object).
struct Twister {
  std::uint32_t* words = nullptr;
  int* position = nullptr;
  int* has_gauss = nullptr;
  double* gauss = nullptr;
};

// torch's CPU generator state as get_state() gives it (aten's CPUGeneratorImplState).
struct TorchState {
  std::uint64_t initial_seed;
  int left;
  int seeded;
  std::uint64_t next;
  std::uint64_t words[kTwisterWords];
  double normal_x, normal_y, normal_rho;
  int normal_is_valid;
  float next_float_normal_sample;
  bool next_float_normal_sample_is_valid;
};
static_assert(sizeof(TorchState) == 5056);

struct Generators {
  py::object keep;             // the objects that own the twisters' memory, kept alive
  py::object random_instance;  // random._inst, whose gauss_next is reset; None if not written
  Twister random, numpy;
  TorchState* torch_state = nullptr;  // the state tensor's bytes, or null
  py::object torch_seed;              // set_state(the state tensor), manual_seed, or None
};

Generators& generators() {
  static auto* g = new Generators;  // never destroyed: the interpreter may outlive statics
  return *g;
}

std::uint64_t splitmix64(std::uint64_t& x) {
  std::uint64_t z = (x += 0x9E3779B97F4A7C15ULL);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

void seed_twister(const Twister& t, std::uint64_t seed) {
  if (t.words == nullptr) return;
  std::uint64_t x = seed;
  for (std::size_t i = 0; i < kTwisterWords; i += 2) {
    const std::uint64_t z = splitmix64(x);
    t.words[i] = static_cast<std::uint32_t>(z);
    t.words[i + 1] = static_cast<std::uint32_t>(z >> 32);
  }
  *t.position = 0;
  if (t.has_gauss != nullptr) {
    *t.has_gauss = 0;
    *t.gauss = 0.0;
  }
}

template <typename T>
T* at(std::uintptr_t address) {
  return reinterpret_cast<T*>(address);  // NOLINT: addresses checked by the caller
}

Twister twister(std::uintptr_t words, std::uintptr_t position, std::uintptr_t has_gauss,
                std::uintptr_t gauss) {
  Twister t;
  if (words == 0) return t;
  t.words = at<std::uint32_t>(words);
  t.position = at<int>(position);
  if (has_gauss != 0) {
    t.has_gauss = at<int>(has_gauss);
    t.gauss = at<double>(gauss);
  }
  return t;
}

void seed_torch(TorchState* state, std::uint64_t seed) {
  state->initial_seed = seed;
  state->left = static_cast<int>(kTwisterWords);  // draws left before it regenerates, + 1
  state->seeded = 1;
  state->next = 0;
  std::uint64_t x = seed;
  for (std::size_t i = 0; i < kTwisterWords; i += 2) {
    const std::uint64_t z = splitmix64(x);
    state->words[i] = static_cast<std::uint32_t>(z);
    state->words[i + 1] = z >> 32;
  }
  state->normal_is_valid = 0;
  state->next_float_normal_sample_is_valid = false;
}

// The streams of random's and numpy's twisters differ: their words come from the sample's
// seed mixed with a constant of each.
constexpr std::uint64_t kRandomStream = 0x5EED0000000000A1ULL;
constexpr std::uint64_t kNumpyStream = 0x5EED0000000000B2ULL;
constexpr std::uint64_t kTorchStream = 0x5EED0000000000C3ULL;

}  // namespace

void bind_seeding(py::module_& m) {
  m.def(
      "configure_sample_seeding",
      [](py::object keep, py::object random_instance, std::uintptr_t random_words,
         std::uintptr_t random_position, std::uintptr_t numpy_words, std::uintptr_t numpy_position,
         std::uintptr_t numpy_has_gauss, std::uintptr_t numpy_gauss, std::uintptr_t torch_state,
         py::object torch_seed) {
        Generators& g = generators();
        g.keep = std::move(keep);
        g.random_instance = std::move(random_instance);
        g.random = twister(random_words, random_position, 0, 0);
        g.numpy = twister(numpy_words, numpy_position, numpy_has_gauss, numpy_gauss);
        g.torch_state = torch_state != 0 ? at<TorchState>(torch_state) : nullptr;
        g.torch_seed = std::move(torch_seed);
      },
      py::arg("keep"), py::arg("random_instance"), py::arg("random_words"),
      py::arg("random_position"), py::arg("numpy_words"), py::arg("numpy_position"),
      py::arg("numpy_has_gauss"), py::arg("numpy_gauss"), py::arg("torch_state"),
      py::arg("torch_seed"),
      "Where seed_sample_generators writes (addresses found and checked by "
      "stoker.loader.sample_seeding; 0 for a twister it does not write) and torch's seeding: "
      "with torch_state, torch_seed is set_state(the tensor at torch_state), called after "
      "writing it; else manual_seed, called with the seed; or None.");
  m.def(
      "seed_sample_generators",
      [](std::optional<std::uint64_t> given) -> py::object {
        const std::optional<std::uint64_t> seed = given ? given : current_sample_seed();
        if (!seed) return py::none();
        Generators& g = generators();
        seed_twister(g.random, *seed ^ kRandomStream);
        if (g.random.words != nullptr) {
          static PyObject* const name = PyUnicode_InternFromString("gauss_next");
          if (PyObject_SetAttr(g.random_instance.ptr(), name, Py_None) != 0) {
            throw py::error_already_set();
          }
        }
        seed_twister(g.numpy, *seed ^ kNumpyStream);
        py::int_ value(*seed);
        if (g.torch_state != nullptr) {
          seed_torch(g.torch_state, *seed ^ kTorchStream);
          g.torch_seed();
        } else if (!g.torch_seed.is_none()) {
          g.torch_seed(value);
        }
        return value;
      },
      py::arg("seed") = py::none(),
      "Seeds the generators configure_sample_seeding set up from `seed` (default: the sample "
      "being read on this thread, stoker.sample_seed()); returns the seed, or None outside a "
      "read.");
}

}  // namespace stoker::python
