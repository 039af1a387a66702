// The library's reads of the environment (stoker/frontend/environment.h): each a copy, taken
// under the guard a front end installs (Python's takes the GIL, so that os.environ's writers
// on other threads wait).
#include "stoker/frontend/environment.h"

#include <gtest/gtest.h>

#include <cstdlib>

namespace stoker::detail {
namespace {

struct GuardCounting {
  int reads = 0;
  GuardCounting() {
    set_environment_guard([this](const std::function<void()>& read) {
      ++reads;
      read();
    });
  }
  ~GuardCounting() { set_environment_guard({}); }
  GuardCounting(const GuardCounting&) = delete;
  GuardCounting& operator=(const GuardCounting&) = delete;
};

TEST(Environment, EveryReadIsACopyTakenUnderTheInstalledGuard) {
  setenv("STOKER_ENV_TEST_A", "alpha", 1);
  setenv("STOKER_ENV_TEST_EMPTY", "", 1);
  unsetenv("STOKER_ENV_TEST_UNSET");
  GuardCounting guard;
  const std::optional<std::string> a = env_var("STOKER_ENV_TEST_A");
  unsetenv("STOKER_ENV_TEST_A");  // the copy stays
  EXPECT_EQ(a, "alpha");
  EXPECT_EQ(env_var("STOKER_ENV_TEST_UNSET"), std::nullopt);
  EXPECT_EQ(env_var("STOKER_ENV_TEST_EMPTY"), "");
  EXPECT_EQ(env_nonempty("STOKER_ENV_TEST_EMPTY"), std::nullopt);
  EXPECT_EQ(guard.reads, 4);
  unsetenv("STOKER_ENV_TEST_EMPTY");
}

TEST(Environment, AFilteredSnapshotHoldsTheNamesAcceptedWithTheirValues) {
  setenv("STOKER_ENV_TEST_ONE", "1", 1);
  setenv("STOKER_ENV_TEST_TWO", "2=two", 1);  // the first '=' ends the name
  GuardCounting guard;
  const auto got =
      env_vars([](std::string_view name) { return name.starts_with("STOKER_ENV_TEST_"); });
  EXPECT_EQ(got, (std::map<std::string, std::string>{{"STOKER_ENV_TEST_ONE", "1"},
                                                     {"STOKER_ENV_TEST_TWO", "2=two"}}));
  EXPECT_EQ(guard.reads, 1);
  unsetenv("STOKER_ENV_TEST_ONE");
  unsetenv("STOKER_ENV_TEST_TWO");
}

TEST(Environment, WithoutAGuardReadsArePlain) {
  setenv("STOKER_ENV_TEST_B", "beta", 1);
  EXPECT_EQ(env_var("STOKER_ENV_TEST_B"), "beta");
  unsetenv("STOKER_ENV_TEST_B");
}

}  // namespace
}  // namespace stoker::detail
