// Loads a small data set through the installed library, touches the image pipeline and
// reports what the library found; exits non-zero if anything is off.
#include <stoker/image.h>
#include <stoker/info.h>
#include <stoker/loader.h>

#include <cstdint>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

class Squares : public stoker::Dataset {
 public:
  std::size_t size() const override { return 1000; }
  std::vector<stoker::FieldSpec> fields() const override {
    return {{"square", stoker::DType::i64, {}}};
  }
  void read(std::size_t i, const stoker::SampleOut& out) const override {
    out.as<std::int64_t>(0)[0] = static_cast<std::int64_t>(i * i);
  }
};

}  // namespace

int main() {
  stoker::LoaderOptions options;
  options.dataset = std::make_shared<Squares>();
  options.batch_size = 64;
  options.shuffle = true;
  options.workers = 2;
  stoker::Loader loader(options);
  std::int64_t sum = 0;
  while (auto batch = loader.next()) {
    for (auto v : batch->as<const std::int64_t>(0)) sum += v;
  }
  const std::int64_t expected = 999LL * 1000 * 1999 / 6;
  if (sum != expected) {
    std::fprintf(stderr, "sum %lld, expected %lld\n", static_cast<long long>(sum),
                 static_cast<long long>(expected));
    return 1;
  }

  // The image pipeline is in the library too: bytes that are no image are refused by name.
  const std::vector<std::byte> junk(16, std::byte{7});
  try {
    stoker::image_size(junk, "junk.bin");
    std::fprintf(stderr, "junk decoded as an image\n");
    return 1;
  } catch (const std::runtime_error& e) {
    if (std::string(e.what()).rfind("junk.bin", 0) != 0) return 1;
  }

  const stoker::CudaInfo cuda = stoker::cuda_info();
  std::printf("stoker %s: %lld, cuda devices %d (%s)\n", std::string(stoker::version()).c_str(),
              static_cast<long long>(sum), cuda.devices,
              cuda.available() ? cuda.library.c_str() : cuda.why.c_str());
  return 0;
}
