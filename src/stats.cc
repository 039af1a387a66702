#include "stoker/stats.h"

#include <sstream>
#include <type_traits>

namespace stoker {
namespace {

// for_each_stat must name every member: a structured binding needs exactly as many names as
// Stats has members, so adding a field without adding it to the table fails to compile here.
[[maybe_unused]] void check_table_covers_stats(const Stats& s) {
  [[maybe_unused]] const auto& [f1, f2, f3, f4, f5, f6, f7, f8, f9, f10, f11, f12, f13, f14, f15,
                                f16, f17, f18, f19, f20, f21, f22, f23, f24, f25, f26, f27, f28,
                                f29, f30, f31, f32, f33, f34, f35, f36, f37, f38, f39, f40, f41,
                                f42, f43, f44, f45, f46, f47] = s;
}

}  // namespace

double Stats::samples_per_second() const {
  return elapsed.count() > 0 ? static_cast<double>(samples) / to_seconds(elapsed) : 0.0;
}
double Stats::bytes_per_second() const {
  return elapsed.count() > 0 ? static_cast<double>(bytes) / to_seconds(elapsed) : 0.0;
}
double Stats::network_bytes_per_second() const {
  return elapsed.count() > 0 ? static_cast<double>(network_bytes) / to_seconds(elapsed) : 0.0;
}
double Stats::wait_fraction() const {
  return elapsed.count() > 0 ? to_seconds(consumer_wait) / to_seconds(elapsed) : 0.0;
}

std::string to_string(const Stats& stats) {
  std::ostringstream out;
  for_each_stat(stats, [&](const char* name, const auto& value) {
    using T = std::decay_t<decltype(value)>;
    if constexpr (std::is_same_v<T, std::chrono::nanoseconds>) {
      out << name << "_s: " << to_seconds(value) << '\n';
    } else {
      out << name << ": " << value << '\n';
    }
  });
  return out.str();
}

}  // namespace stoker
