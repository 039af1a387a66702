// Weight schedules of a token mix (stoker/tokens.h: TokenWeightStep): each batch holds its
// segment's shares, the samples before a segment do not depend on it, a schedule of one
// segment is the plain weights' index, bad schedules are named by their step.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "stoker/tokens.h"

namespace stoker {
namespace {

using Schedule = std::vector<TokenWeightStep>;

// The weights of `step` under `schedule`.
const std::vector<double>& weights_at(const Schedule& schedule, std::size_t step) {
  std::size_t k = 0;
  while (k + 1 < schedule.size() && schedule[k + 1].step <= step) ++k;
  return schedule[k].weights;
}

// FNV-1a over an index's sources, rows and epochs (tokens_test.cc's index_digest).
std::uint64_t index_digest(const TokenMixIndex& x) {
  std::uint64_t h = 1469598103934665603ull;
  auto add = [&](std::uint64_t v) {
    for (int i = 0; i < 8; ++i) {
      h ^= (v >> (8 * i)) & 0xff;
      h *= 1099511628211ull;
    }
  };
  for (const auto v : x.source) add(v);
  for (const auto v : x.row) add(v);
  for (const auto v : x.epochs) add(v);
  return h;
}

// The message of the std::invalid_argument `fn` throws ("" when it throws none).
template <class Fn>
std::string invalid(Fn fn) {
  try {
    fn();
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

TEST(TokenWeightSchedule, EveryBatchHoldsItsOwnSegmentsShareWithinOneSample) {
  std::mt19937_64 rng(23);
  for (int trial = 0; trial < 40; ++trial) {
    const std::size_t sources = 1 + rng() % 6;
    const std::size_t batch = 1 + rng() % 200, batches = 60;
    Schedule schedule;
    for (std::size_t step = 0; step < batches; step += 1 + rng() % 25) {
      std::vector<double> w(sources);
      for (auto& x : w) x = rng() % 4 == 0 ? 0.0 : std::uniform_real_distribution(0.1, 3.0)(rng);
      if (std::accumulate(w.begin(), w.end(), 0.0) == 0) w[0] = 1;
      schedule.push_back({step, w});
    }
    const auto blend = stratified_blend(schedule, batch, batches, trial);
    ASSERT_EQ(blend.source.size(), batch * batches);
    std::vector<std::uint64_t> total(sources, 0), since(sources, 0);
    std::size_t start = 0;  // the batch's segment's first batch
    for (std::size_t b = 0; b < batches; ++b) {
      const auto& w = weights_at(schedule, b);
      if (&w != &weights_at(schedule, start) || b == 0) {
        start = b;
        since = total;
      }
      std::vector<std::uint64_t> in_batch(sources, 0);
      for (std::size_t i = b * batch; i < (b + 1) * batch; ++i) {
        const auto s = blend.source[i];
        EXPECT_EQ(blend.draw[i], total[s]) << "draws count each source's samples from the start";
        ++in_batch[s];
        ++total[s];
      }
      const double sum = std::accumulate(w.begin(), w.end(), 0.0);
      for (std::size_t s = 0; s < sources; ++s) {
        const double share = w[s] / sum * static_cast<double>(batch);
        EXPECT_LE(std::abs(static_cast<double>(in_batch[s]) - share), 1.0)
            << "trial " << trial << " batch " << b << " source " << s;
        // within the segment so far, within one sample of its share too
        EXPECT_LT(std::abs(static_cast<double>(total[s] - since[s]) -
                           share * static_cast<double>(b - start + 1)),
                  1.0 + 1e-9)
            << "trial " << trial << " batch " << b << " source " << s;
        if (w[s] == 0) {
          EXPECT_EQ(in_batch[s], 0u);
        }
      }
    }
  }
}

TEST(TokenWeightSchedule, AScheduleOfOneSegmentIsThePlainWeightsIndexOnAnyThreads) {
  // The digests tokens_test.cc's BuiltInParallelItIsTheOrderTheSequentialBuildGave pins for the
  // plain weights: a schedule of one segment (or of segments that change nothing) is that index.
  const std::vector<double> weights = {3, 1, 4, 1, 5, 9, 2, 6, 5, 3};
  const std::vector<std::uint64_t> rows = {1000, 7, 50000, 3, 20000, 90000, 1, 40000, 333, 12345};
  const std::vector<std::pair<std::pair<TokenMixing, std::size_t>, std::uint64_t>> expected = {
      {{TokenMixing::stratified, 48}, 0x11cecd70419906f8ull},
      {{TokenMixing::iid, 48}, 0x3962607cadb242faull}};
  const std::vector<Schedule> same = {{{0, weights}}, {{0, weights}, {500, weights}}};
  for (const auto& [what, digest] : expected) {
    for (const auto& schedule : same) {
      for (const std::size_t threads : {1, 2, 7}) {
        const auto index =
            token_mix_index(rows, schedule, what.first, what.second, 1'000'003, 11, threads);
        EXPECT_EQ(index_digest(index), digest)
            << "mixing " << static_cast<int>(what.first) << ", " << schedule.size() << " segments, "
            << threads << " threads";
      }
    }
  }
  EXPECT_EQ(checked_schedule(same[1]).size(), 1u);
}

TEST(TokenWeightSchedule, AScheduleIndexIsTheSameOnAnyNumberOfThreads) {
  const std::vector<std::uint64_t> rows = {1000, 7, 50000, 3};
  const Schedule schedule = {
      {0, {3, 1, 4, 1}}, {777, {0, 1, 1, 5}}, {5000, {1, 0, 0, 0}}, {9000, {0.3, 0.3, 0.3, 0.1}}};
  for (const auto mixing : {TokenMixing::stratified, TokenMixing::iid}) {
    const auto one = token_mix_index(rows, schedule, mixing, 100, 1'000'003, 5, 1);
    for (const std::size_t threads : {2, 7}) {
      const auto many = token_mix_index(rows, schedule, mixing, 100, 1'000'003, 5, threads);
      EXPECT_EQ(many.source, one.source) << threads << " threads";
      EXPECT_EQ(many.row, one.row) << threads << " threads";
      EXPECT_EQ(many.epochs, one.epochs) << threads << " threads";
    }
  }
}

TEST(TokenWeightSchedule, TheSamplesBeforeASegmentDoNotDependOnItOrAnyLaterOne) {
  // A run to step 300 with schedule A, resumed with B (A's segments before step 300, others
  // from it): the samples before step 300 are the same, and each source's rows go on from the
  // draws already made (B's index is A's up to the cut, then B's own).
  const std::vector<std::uint64_t> rows = {500, 40, 7, 1000};
  const std::size_t batch = 48, cut = 300, samples = 48 * 700 + 17;
  const Schedule a = {{0, {0.6, 0.25, 0.1, 0.05}}, {200, {0.1, 0.1, 0.1, 0.7}}};
  const Schedule b = {{0, {0.6, 0.25, 0.1, 0.05}},
                      {200, {0.1, 0.1, 0.1, 0.7}},
                      {300, {0, 1, 1, 0}},
                      {650, {1, 1, 1, 1}}};
  const Schedule c = {
      {0, {0.6, 0.25, 0.1, 0.05}}, {200, {0.1, 0.1, 0.1, 0.7}}, {450, {5, 0, 0, 1}}};
  for (const auto mixing : {TokenMixing::stratified, TokenMixing::iid}) {
    const auto ia = token_mix_index(rows, a, mixing, batch, samples, 9);
    for (const auto& later : {b, c}) {
      const auto ib = token_mix_index(rows, later, mixing, batch, samples, 9);
      const std::size_t first = later[2].step * batch;  // the first sample that may differ
      ASSERT_GE(first, cut * batch);
      for (std::size_t i = 0; i < first; ++i) {
        ASSERT_EQ(ib.source[i], ia.source[i]) << "sample " << i;
        ASSERT_EQ(ib.row[i], ia.row[i]) << "sample " << i;
      }
      EXPECT_NE(ib.source, ia.source);
      // The draws of each source after the cut continue from its draws before it: the same
      // rows as the plain blend of draws would give (draw d of a source: its epoch 0 row d).
      const auto blend = mixing == TokenMixing::stratified
                             ? stratified_blend(later, batch, samples / batch, 9)
                             : iid_blend(later, batch, samples, 9);
      std::vector<std::uint64_t> count(rows.size(), 0);
      for (std::size_t i = 0; i < blend.source.size(); ++i) {
        const auto s = blend.source[i];
        ASSERT_EQ(blend.draw[i], count[s]++) << "sample " << i;
        if (blend.draw[i] < rows[s]) {
          ASSERT_EQ(ib.row[i], blend.draw[i]) << "sample " << i;
        }
      }
    }
  }
}

TEST(TokenWeightSchedule, IidSamplesDrawByTheWeightsOfTheirStep) {
  const std::vector<std::uint64_t> rows = {100, 100, 100};
  const std::vector<double> first = {1, 0, 0}, later = {1, 2, 3};
  const Schedule schedule = {{0, first}, {10, later}};
  const auto index = token_mix_index(rows, schedule, TokenMixing::iid, 8, 800, 4);
  const auto plain = token_mix_index(rows, later, TokenMixing::iid, 8, 800, 4);
  for (std::size_t i = 0; i < 80; ++i) EXPECT_EQ(index.source[i], 0u) << "sample " << i;
  // The same generator's draws: from step 10 on, the sources of the plain weights' mix.
  for (std::size_t i = 80; i < 800; ++i) EXPECT_EQ(index.source[i], plain.source[i]) << i;
  // Without a global batch (batch 1) a step is a sample.
  const auto by_sample = token_mix_index(rows, schedule, TokenMixing::iid, 1, 800, 4);
  for (std::size_t i = 0; i < 10; ++i) EXPECT_EQ(by_sample.source[i], 0u);
  for (std::size_t i = 10; i < 800; ++i) EXPECT_EQ(by_sample.source[i], plain.source[i]) << i;
}

TEST(TokenWeightSchedule, AStratifiedMixsPartialLastBatchHoldsItsSegmentsShare) {
  // The last, partial batch is in the segment of its step: the segment's samples hold its
  // shares within one sample.
  const std::vector<std::uint64_t> rows = {100, 100};
  const Schedule schedule = {{0, {1, 0}}, {5, {1, 3}}};
  const std::size_t batch = 10, samples = 10 * 7 + 6;
  const auto index = token_mix_index(rows, schedule, TokenMixing::stratified, batch, samples, 1);
  std::vector<double> n(2, 0);
  for (std::size_t i = 50; i < samples; ++i) ++n[index.source[i]];
  EXPECT_LE(std::abs(n[0] - 0.25 * (samples - 50)), 1.0);
  EXPECT_LE(std::abs(n[1] - 0.75 * (samples - 50)), 1.0);
  for (std::size_t i = 0; i < 50; ++i) EXPECT_EQ(index.source[i], 0u);
}

TEST(TokenWeightSchedule, ABadScheduleIsNamedByItsSegmentsStep) {
  const std::vector<std::uint64_t> rows = {10, 10};
  auto message = [&](const Schedule& schedule) {
    return invalid([&] { token_mix_index(rows, schedule, TokenMixing::stratified, 4, 100, 0); });
  };
  EXPECT_NE(message({}).find("needs a segment at step 0"), std::string::npos);
  EXPECT_NE(message({{5, {1, 1}}}).find("starts at step 0"), std::string::npos);
  EXPECT_NE(message({{5, {1, 1}}}).find("not at step 5"), std::string::npos);
  EXPECT_NE(message({{0, {1, 1}}, {8, {1, 2}}, {8, {2, 1}}}).find("step 8 follows step 8"),
            std::string::npos);
  EXPECT_NE(message({{0, {1, 1}}, {9, {1, 2}}, {3, {2, 1}}}).find("step 3 follows step 9"),
            std::string::npos);
  EXPECT_NE(message({{0, {1, 1}}, {7, {1, 2, 3}}})
                .find("3 weights for 2 sources in the weight "
                      "schedule's segment at step 7"),
            std::string::npos);
  EXPECT_NE(message({{0, {1, 1}}, {7, {1, -2}}}).find("source 1's weight"), std::string::npos);
  EXPECT_NE(message({{0, {1, 1}}, {7, {1, -2}}}).find("segment at step 7"), std::string::npos);
  EXPECT_NE(message({{0, {1, 1}}, {6, {1, NAN}}}).find("segment at step 6"), std::string::npos);
  EXPECT_NE(message({{0, {1, 1}}, {6, {1, INFINITY}}}).find("segment at step 6"),
            std::string::npos);
  EXPECT_NE(message({{0, {1, 1}}, {4, {0, 0}}})
                .find("every source's weight is 0 in the weight "
                      "schedule's segment at step 4"),
            std::string::npos);
  const std::vector<std::uint64_t> empty_second = {10, 0};
  EXPECT_NE(invalid([&] {
              token_mix_index(empty_second, Schedule{{0, {1, 0}}, {3, {1, 1}}}, TokenMixing::iid, 4,
                              100, 0);
            })
                .find("source 1 has no rows but a weight of 1.000000 in the weight schedule's "
                      "segment at step 3"),
            std::string::npos);
  EXPECT_EQ(message({{0, {1, 1}}, {3, {1, 2}}}), "");
}

}  // namespace
}  // namespace stoker
