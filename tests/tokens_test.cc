// Token data (stoker/tokens.h): the packing plan on synthetic document lengths, the token
// sources on files written here, and the packed rows' fields.
#include "stoker/tokens.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "stoker/log.h"
#include "support/errors.h"

namespace stoker {
namespace {

namespace fs = std::filesystem;

// ---- The plan -----------------------------------------------------------------------------

std::vector<std::uint32_t> log_normal_lengths(std::size_t n, double median, double sigma,
                                              std::uint32_t seed) {
  std::mt19937_64 rng(seed);
  std::lognormal_distribution<double> dist(std::log(median), sigma);
  std::vector<std::uint32_t> out(n);
  for (auto& v : out) v = static_cast<std::uint32_t>(std::max(1.0, std::round(dist(rng))));
  return out;
}

TokenPackOptions options(TokenPackOptions::Mode mode, std::size_t seq_len, std::uint64_t seed = 1) {
  TokenPackOptions o;
  o.mode = mode;
  o.seq_len = seq_len;
  o.seed = seed;
  return o;
}

// Every row within seq_len, pieces inside their documents; returns, per document, the tokens
// the plan uses of it, as (offset, length) pieces sorted.
std::map<std::uint64_t, std::vector<std::pair<std::uint32_t, std::uint32_t>>> check_rows(
    const TokenPlan& plan, std::span<const std::uint32_t> lengths) {
  std::map<std::uint64_t, std::vector<std::pair<std::uint32_t, std::uint32_t>>> used;
  std::uint64_t tokens = 0;
  std::size_t most = 0;
  for (std::size_t r = 0; r < plan.rows(); ++r) {
    std::uint64_t in_row = 0;
    for (const auto& p : plan.row(r)) {
      EXPECT_GT(p.length, 0u);
      EXPECT_LE(p.offset + p.length, lengths[p.doc]);
      used[p.doc].emplace_back(p.offset, p.length);
      in_row += p.length;
    }
    EXPECT_LE(in_row, plan.seq_len);
    tokens += in_row;
    most = std::max(most, plan.row(r).size());
  }
  EXPECT_EQ(tokens, plan.tokens);
  EXPECT_EQ(most, plan.max_pieces);
  for (auto& [doc, pieces] : used) std::sort(pieces.begin(), pieces.end());
  return used;
}

TEST(TokenPlan, ConcatenateAndSplitCutsTheShuffledStreamIntoFullRows) {
  const auto lengths = log_normal_lengths(5000, 300, 1.2, 7);
  const auto plan = plan_rows(lengths, options(TokenPackOptions::Mode::concat, 1024));
  std::uint64_t total = 0;
  for (auto n : lengths) total += n;
  ASSERT_EQ(plan.rows(), total / 1024);
  EXPECT_DOUBLE_EQ(plan.fill(), 1.0);
  // Read back as one stream: each piece continues the previous one's document where it left
  // off, or starts the next document at 0 once that one is done; every row is exactly full.
  std::vector<bool> seen(lengths.size(), false);
  const TokenPiece* prev = nullptr;
  for (std::size_t r = 0; r < plan.rows(); ++r) {
    std::uint64_t in_row = 0;
    for (const auto& p : plan.row(r)) {
      if (prev != nullptr && prev->offset + prev->length < lengths[prev->doc]) {
        EXPECT_EQ(p.doc, prev->doc);
        EXPECT_EQ(p.offset, prev->offset + prev->length);
      } else {
        EXPECT_EQ(p.offset, 0u);
        EXPECT_FALSE(seen[p.doc]) << "document " << p.doc << " started twice";
        seen[p.doc] = true;
      }
      in_row += p.length;
      prev = &p;
    }
    EXPECT_EQ(in_row, 1024u);
  }
  check_rows(plan, lengths);
  // Shuffled: not the corpus's order.
  auto o = options(TokenPackOptions::Mode::concat, 1024);
  o.shuffle_documents = false;
  EXPECT_NE(plan.pieces, plan_rows(lengths, o).pieces);
}

TEST(TokenPlan, ConcatenateWithoutShufflingFollowsTheCorpusOrder) {
  const std::vector<std::uint32_t> lengths = {3, 5, 2, 7};
  auto o = options(TokenPackOptions::Mode::concat, 4);
  o.shuffle_documents = false;
  const auto plan = plan_rows(lengths, o);
  // The stream 0 0 0 1 | 1 1 1 1 | 2 2 3 3 | 3 3 3 (dropped: a partial row)
  ASSERT_EQ(plan.rows(), 4u);
  const std::vector<TokenPiece> expected = {{0, 0, 3}, {1, 0, 1}, {1, 1, 4},
                                            {2, 0, 2}, {3, 0, 2}, {3, 2, 4}};
  EXPECT_EQ(plan.pieces, expected);
  EXPECT_EQ(plan.row_starts, (std::vector<std::uint64_t>{0, 2, 3, 5, 6}));
}

TEST(TokenPlan, BestFitPutsEachDocumentInTheRowWithTheLeastRoomThatHoldsIt) {
  const std::vector<std::uint32_t> lengths = {6, 5, 4, 3, 2};
  auto o = options(TokenPackOptions::Mode::best_fit, 10);
  o.shuffle_documents = false;
  const auto plan = plan_rows(lengths, o);
  // 6 opens row 0 (room 4); 5 opens row 1 (room 5); 4 fills row 0 exactly (room 4 beats 5);
  // 3 goes to row 1 (room 2 left); 2 fills row 1.
  ASSERT_EQ(plan.rows(), 2u);
  EXPECT_EQ(plan.pieces,
            (std::vector<TokenPiece>{{0, 0, 6}, {2, 0, 4}, {1, 0, 5}, {3, 0, 3}, {4, 0, 2}}));
  EXPECT_EQ(plan.max_pieces, 3u);
  EXPECT_DOUBLE_EQ(plan.fill(), 1.0);
}

TEST(TokenPlan, BestFitKeepsEveryDocumentWholeAndPacksLogNormalDocumentsFull) {
  const auto lengths = log_normal_lengths(200000, 300, 1.2, 11);
  const auto plan = plan_rows(lengths, options(TokenPackOptions::Mode::best_fit, 4096));
  const auto used = check_rows(plan, lengths);
  ASSERT_EQ(used.size(), lengths.size());
  for (const auto& [doc, pieces] : used) {
    // Split into seq_len pieces only when longer than a row, and nothing lost.
    std::uint32_t next = 0;
    for (const auto& [offset, length] : pieces) {
      EXPECT_EQ(offset, next);
      next += length;
    }
    EXPECT_EQ(next, lengths[doc]);
    if (lengths[doc] <= 4096) {
      EXPECT_EQ(pieces.size(), 1u);
    }
  }
  EXPECT_GT(plan.fill(), 0.99) << "best-fit fill on median-300, sigma-1.2 documents";
}

TEST(TokenPlan, LongDocumentsAreSplitOrTruncatedAsAsked) {
  const std::vector<std::uint32_t> lengths = {25, 3};
  auto o = options(TokenPackOptions::Mode::best_fit, 10);
  o.shuffle_documents = false;
  const auto split = plan_rows(lengths, o);
  // 10 | 10 | 5 (+3 in its room)
  EXPECT_EQ(split.pieces,
            (std::vector<TokenPiece>{{0, 0, 10}, {0, 10, 10}, {0, 20, 5}, {1, 0, 3}}));
  EXPECT_EQ(split.tokens, 28u);
  o.long_documents = TokenPackOptions::Long::truncate;
  const auto truncated = plan_rows(lengths, o);
  EXPECT_EQ(truncated.pieces, (std::vector<TokenPiece>{{0, 0, 10}, {1, 0, 3}}));
  EXPECT_EQ(truncated.rows(), 2u);
}

TEST(TokenPlan, IsAPureFunctionOfLengthsModeSeqLenAndSeed) {
  const auto lengths = log_normal_lengths(20000, 300, 1.2, 3);
  for (auto mode : {TokenPackOptions::Mode::concat, TokenPackOptions::Mode::best_fit}) {
    const auto a = plan_rows(lengths, options(mode, 2048, 5));
    const auto b = plan_rows(lengths, options(mode, 2048, 5));
    EXPECT_EQ(a.pieces, b.pieces);
    EXPECT_EQ(a.row_starts, b.row_starts);
    const auto c = plan_rows(lengths, options(mode, 2048, 6));
    EXPECT_NE(a.pieces, c.pieces) << "another seed orders the documents otherwise";
  }
}

TEST(TokenPlan, ReplansAMillionDocumentsInEitherMode) {
  // How fast: bench/token_bench.py (tests do not assert on time).
  const auto lengths = log_normal_lengths(1'000'000, 300, 1.2, 5);
  for (auto mode : {TokenPackOptions::Mode::concat, TokenPackOptions::Mode::best_fit}) {
    const auto plan = plan_rows(lengths, options(mode, 4096));
    EXPECT_GT(plan.rows(), 100000u)
        << (mode == TokenPackOptions::Mode::concat ? "concat" : "best_fit");
  }
}

TEST(TokenPlan, RefusesABadSeqLenAndEmptyDocuments) {
  const std::vector<std::uint32_t> lengths = {4, 0, 2};
  EXPECT_NE(error_of([&] {
              plan_rows(lengths, options(TokenPackOptions::Mode::concat, 8));
            }).find("document 1 is empty"),
            std::string::npos);
  const std::vector<std::uint32_t> fine = {4};
  EXPECT_NE(error_of([&] {
              plan_rows(fine, options(TokenPackOptions::Mode::concat, 0));
            }).find("seq_len"),
            std::string::npos);
}

// ---- Mixing -------------------------------------------------------------------------------

TEST(TokenBlend, EveryBatchHoldsEachSourcesShareWithinOneSample) {
  std::mt19937_64 rng(17);
  for (int trial = 0; trial < 50; ++trial) {
    const std::size_t sources = 1 + rng() % 10;
    std::vector<double> weights(sources);
    for (auto& w : weights) w = std::uniform_real_distribution<double>(0.01, 5.0)(rng);
    if (trial % 5 == 0 && sources > 1) weights[0] = 0;  // a source weighted 0 is never drawn
    const std::size_t batch = 1 + rng() % 300, batches = 50;
    const auto blend = stratified_blend(weights, batch, batches, trial);
    ASSERT_EQ(blend.source.size(), batch * batches);
    const double sum = std::accumulate(weights.begin(), weights.end(), 0.0);
    std::vector<std::uint64_t> total(sources, 0);
    for (std::size_t b = 0; b < batches; ++b) {
      std::vector<std::uint64_t> in_batch(sources, 0);
      for (std::size_t i = b * batch; i < (b + 1) * batch; ++i) {
        const auto s = blend.source[i];
        ASSERT_LT(s, sources);
        EXPECT_EQ(blend.draw[i], total[s]) << "draws count each source's samples in order";
        ++in_batch[s];
        ++total[s];
      }
      for (std::size_t s = 0; s < sources; ++s) {
        const double share = weights[s] / sum * static_cast<double>(batch);
        EXPECT_LE(std::abs(static_cast<double>(in_batch[s]) - share), 1.0)
            << "trial " << trial << " batch " << b << " source " << s;
        // and over the stream so far, within one sample of the share too
        EXPECT_LT(std::abs(static_cast<double>(total[s]) - share * static_cast<double>(b + 1)),
                  1.0 + 1e-9)
            << "trial " << trial << " batch " << b << " source " << s;
      }
    }
    if (weights[0] == 0) {
      EXPECT_EQ(total[0], 0u);
    }
  }
}

TEST(TokenBlend, IsAPureFunctionAndShufflesWithinBatches) {
  const std::vector<double> weights = {0.5, 0.3, 0.2};
  const auto a = stratified_blend(weights, 10, 100, 1);
  const auto b = stratified_blend(weights, 10, 100, 1);
  EXPECT_EQ(a.source, b.source);
  EXPECT_EQ(a.draw, b.draw);
  const auto c = stratified_blend(weights, 10, 100, 2);
  EXPECT_NE(a.source, c.source);
  // Exact shares: 5, 3 and 2 of every 10.
  for (std::size_t i = 0; i < a.source.size(); i += 10) {
    std::vector<int> n(3, 0);
    for (std::size_t k = i; k < i + 10; ++k) ++n[a.source[k]];
    EXPECT_EQ(n, (std::vector<int>{5, 3, 2}));
  }
  EXPECT_THROW(stratified_blend(std::vector<double>{0, 0}, 4, 1, 0), std::invalid_argument);
  EXPECT_THROW(stratified_blend(std::vector<double>{1, -1}, 4, 1, 0), std::invalid_argument);
  EXPECT_THROW(stratified_blend(std::vector<double>{}, 4, 1, 0), std::invalid_argument);
}

TEST(TokenBlend, BlendsTenMillionSamplesOfTenSources) {
  const std::vector<double> weights = {3, 1, 4, 1, 5, 9, 2, 6, 5, 3};
  const auto blend = stratified_blend(weights, 1024, 10'000'000 / 1024, 7);
  EXPECT_EQ(blend.source.size(), 1024u * (10'000'000 / 1024));
}

TEST(TokenMixIndex, StratifiedEveryGlobalBatchHoldsEachSourcesShareWithinOneRow) {
  const std::vector<double> weights = {0.6, 0.25, 0.1, 0.05};
  const std::vector<std::uint64_t> rows = {500, 40, 7, 1000};  // the small ones wrap around
  const std::size_t batch = 48, samples = 48 * 200 + 17;       // a partial last batch
  const auto index = token_mix_index(rows, weights, TokenMixing::stratified, batch, samples, 3);
  ASSERT_EQ(index.source.size(), samples);
  ASSERT_EQ(index.row.size(), samples);
  std::size_t within = 0, batches = 0;
  for (std::size_t b = 0; (b + 1) * batch <= samples; ++b, ++batches) {
    std::vector<double> n(weights.size(), 0);
    for (std::size_t i = b * batch; i < (b + 1) * batch; ++i) ++n[index.source[i]];
    bool ok = true;
    for (std::size_t s = 0; s < weights.size(); ++s) {
      ok = ok && std::abs(n[s] - weights[s] * static_cast<double>(batch)) <= 1.0;
    }
    within += ok ? 1 : 0;
  }
  EXPECT_EQ(within, batches);  // 100% of the global batches
  for (std::size_t i = 0; i < samples; ++i) ASSERT_LT(index.row[i], rows[index.source[i]]);
}

TEST(TokenMixIndex, AStratifiedMixOfWholeSharesHoldsExactlyEachSourcesRowsToItsPartialEnd) {
  // A budget of rows a source (TokenMix's epochs= or tokens=): the weights are the rows, the
  // samples their sum, not a multiple of the global batch; the last, partial batch makes up
  // each source's count, and short of whole shares the whole mix stays within one sample.
  const std::vector<double> budget = {226, 243, 110, 0};
  const std::vector<std::uint64_t> rows = {452, 243, 44, 9};
  const auto index = token_mix_index(rows, budget, TokenMixing::stratified, 8, 579, 2);
  std::vector<std::size_t> n(budget.size(), 0);
  for (const auto s : index.source) ++n[s];
  EXPECT_EQ(n, (std::vector<std::size_t>{226, 243, 110, 0}));
  const std::vector<double> weights = {0.6, 0.25, 0.1, 0.05};
  const auto other = token_mix_index(rows, weights, TokenMixing::stratified, 48, 48 * 3 + 17, 4);
  n.assign(weights.size(), 0);
  for (const auto s : other.source) ++n[s];
  for (std::size_t s = 0; s < weights.size(); ++s) {
    EXPECT_LE(std::abs(static_cast<double>(n[s]) - weights[s] * (48 * 3 + 17)), 1.0) << s;
  }
}

TEST(TokenMixIndex, IidDrawsStayWithinTheBinomialSpread) {
  const std::vector<double> weights = {5, 3, 2};
  const std::vector<std::uint64_t> rows = {1000, 1000, 1000};
  const std::size_t batch = 256, samples = 256 * 400;
  const auto index = token_mix_index(rows, weights, TokenMixing::iid, batch, samples, 11);
  std::vector<double> total(3, 0);
  for (std::size_t b = 0; b < samples / batch; ++b) {
    std::vector<double> n(3, 0);
    for (std::size_t i = b * batch; i < (b + 1) * batch; ++i) ++n[index.source[i]];
    for (std::size_t s = 0; s < 3; ++s) {
      const double p = weights[s] / 10, mean = p * batch, sd = std::sqrt(batch * p * (1 - p));
      EXPECT_LE(std::abs(n[s] - mean), 5 * sd) << "batch " << b << " source " << s;
      total[s] += n[s];
    }
  }
  for (std::size_t s = 0; s < 3; ++s) {
    const double p = weights[s] / 10, mean = p * samples, sd = std::sqrt(samples * p * (1 - p));
    EXPECT_LE(std::abs(total[s] - mean), 5 * sd) << "source " << s;
  }
  // Not stratified: some batch strays more than one row from its share.
  bool strays = false;
  for (std::size_t b = 0; b < samples / batch && !strays; ++b) {
    double n0 = 0;
    for (std::size_t i = b * batch; i < (b + 1) * batch; ++i) n0 += index.source[i] == 0;
    strays = std::abs(n0 - 0.5 * batch) > 1.0;
  }
  EXPECT_TRUE(strays);
}

TEST(TokenMixIndex, ASourceThatRunsOutWrapsAroundToItsNextEpochInAnotherOrder) {
  // Source 0 has 3 rows and half of 60 samples: 10 epochs of it.
  const std::vector<double> weights = {1, 1};
  const std::vector<std::uint64_t> rows = {3, 100};
  const auto index = token_mix_index(rows, weights, TokenMixing::stratified, 2, 60, 5);
  std::vector<std::uint64_t> zero;
  for (std::size_t i = 0; i < 60; ++i) {
    if (index.source[i] == 0) zero.push_back(index.row[i]);
  }
  ASSERT_EQ(zero.size(), 30u);
  EXPECT_EQ(index.epochs, (std::vector<std::uint64_t>{10, 1}));
  EXPECT_EQ((std::vector<std::uint64_t>(zero.begin(), zero.begin() + 3)),
            (std::vector<std::uint64_t>{0, 1, 2}));  // epoch 0: the source's own order
  std::set<std::vector<std::uint64_t>> orders;
  for (std::size_t e = 0; e < 10; ++e) {
    std::vector<std::uint64_t> epoch(zero.begin() + 3 * e, zero.begin() + 3 * e + 3);
    orders.insert(epoch);
    std::sort(epoch.begin(), epoch.end());
    EXPECT_EQ(epoch, (std::vector<std::uint64_t>{0, 1, 2})) << "epoch " << e << " reads each once";
  }
  EXPECT_GT(orders.size(), 1u);  // later epochs are permuted
}

TEST(TokenMixIndex, IsAPureFunctionOfSourcesWeightsMixingAndSeed) {
  const std::vector<double> weights = {2, 1, 1};
  const std::vector<std::uint64_t> rows = {50, 20, 9};
  for (const auto mixing : {TokenMixing::stratified, TokenMixing::iid}) {
    const auto a = token_mix_index(rows, weights, mixing, 8, 400, 1);
    const auto b = token_mix_index(rows, weights, mixing, 8, 400, 1);
    const auto c = token_mix_index(rows, weights, mixing, 8, 400, 2);
    EXPECT_EQ(a.source, b.source);
    EXPECT_EQ(a.row, b.row);
    EXPECT_NE(a.source, c.source);
  }
}

TEST(TokenMixIndex, RefusesMissingWeightsAndAWeightedSourceWithoutRows) {
  const std::vector<std::uint64_t> rows = {5, 0};
  EXPECT_THROW(token_mix_index(rows, std::vector<double>{1}, TokenMixing::iid, 1, 10, 0),
               std::invalid_argument);
  EXPECT_THROW(token_mix_index(rows, std::vector<double>{1, 1}, TokenMixing::iid, 1, 10, 0),
               std::invalid_argument);
  EXPECT_THROW(token_mix_index(rows, std::vector<double>{1, 0}, TokenMixing::stratified, 0, 10, 0),
               std::invalid_argument);
  const auto ok = token_mix_index(rows, std::vector<double>{1, 0}, TokenMixing::iid, 1, 10, 0);
  EXPECT_EQ(ok.epochs, (std::vector<std::uint64_t>{2, 0}));  // a source weighted 0 is not read
  const std::vector<std::uint64_t> three = {5, 5, 5};
  const auto zeros =
      token_mix_index(three, std::vector<double>{0, 1, 0}, TokenMixing::iid, 1, 1000, 3);
  EXPECT_EQ(zeros.epochs, (std::vector<std::uint64_t>{0, 200, 0}));
}

// FNV-1a over an index's sources, rows and epochs, byte by byte.
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

TEST(TokenMixIndex, BuiltInParallelItIsTheOrderTheSequentialBuildGave) {
  // The digests of the indexes the one-thread build (before the parallel one) gave: the order
  // is part of what a saved state resumes, so it never changes with the build.
  const std::vector<double> weights = {3, 1, 4, 1, 5, 9, 2, 6, 5, 3};
  const std::vector<std::uint64_t> rows = {1000, 7, 50000, 3, 20000, 90000, 1, 40000, 333, 12345};
  const std::map<std::pair<TokenMixing, std::size_t>, std::uint64_t> expected = {
      {{TokenMixing::stratified, 1}, 0xd9cc55094945a264ull},
      {{TokenMixing::stratified, 48}, 0x11cecd70419906f8ull},
      {{TokenMixing::stratified, 1024}, 0x99afa123f59edd50ull},
      {{TokenMixing::iid, 48}, 0x3962607cadb242faull}};
  for (const auto& [what, digest] : expected) {
    for (const std::size_t threads : {1, 2, 7}) {
      const auto index =
          token_mix_index(rows, weights, what.first, what.second, 1'000'003, 11, threads);
      EXPECT_EQ(index_digest(index), digest)
          << "mixing " << static_cast<int>(what.first) << ", batch " << what.second << ", "
          << threads << " threads";
    }
  }
}

TEST(TokenBlend, IsTheSameOnAnyNumberOfThreads) {
  const std::vector<double> weights = {0.5, 0.3, 0.2, 0.7};
  const auto one = stratified_blend(weights, 100, 3000, 5, 1);
  const auto iid = iid_blend(weights, 300'001, 5, 1);
  for (const std::size_t threads : {2, 3, 16}) {
    const auto many = stratified_blend(weights, 100, 3000, 5, threads);
    EXPECT_EQ(many.source, one.source);
    EXPECT_EQ(many.draw, one.draw);
    const auto iid_many = iid_blend(weights, 300'001, 5, threads);
    EXPECT_EQ(iid_many.source, iid.source);
    EXPECT_EQ(iid_many.draw, iid.draw);
  }
}

TEST(TokenMixIndex, IndexesTenMillionSamplesOfTenSources) {
  const std::vector<double> weights = {3, 1, 4, 1, 5, 9, 2, 6, 5, 3};
  const std::vector<std::uint64_t> rows(10, 400'000);  // sources wrap around several times
  const auto index = token_mix_index(rows, weights, TokenMixing::stratified, 1024, 10'000'000, 7);
  EXPECT_EQ(index.row.size(), 10'000'000u);
}

// ---- Sources ------------------------------------------------------------------------------

class TokenFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = (fs::temp_directory_path() / "stoker-tokens-XXXXXX").string();
    ASSERT_NE(mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  static void write(const std::string& path, const std::string& bytes) {
    std::ofstream(path, std::ios::binary).write(bytes.data(), static_cast<long>(bytes.size()));
  }
  template <class T>
  static void put(std::string& s, T v) {
    s.append(reinterpret_cast<const char*>(&v), sizeof v);
  }

  // A Megatron data set PREFIX.{bin,idx} of `docs`, tokens of type T (dtype `code`).
  template <class T>
  std::string megatron(const std::string& name, const std::vector<std::vector<T>>& docs,
                       std::uint8_t code) const {
    const std::string prefix = path(name);
    std::string bin, idx("MMIDIDX\0\0", 9);
    put<std::uint64_t>(idx, 1);
    put<std::uint8_t>(idx, code);
    put<std::uint64_t>(idx, docs.size());
    put<std::uint64_t>(idx, docs.size() + 1);
    for (const auto& d : docs) put<std::int32_t>(idx, static_cast<std::int32_t>(d.size()));
    std::int64_t ptr = 0;
    for (const auto& d : docs) {
      put<std::int64_t>(idx, ptr);
      ptr += static_cast<std::int64_t>(d.size() * sizeof(T));
    }
    for (std::size_t i = 0; i <= docs.size(); ++i)
      put<std::int64_t>(idx, static_cast<std::int64_t>(i));
    for (const auto& d : docs) {
      for (T t : d) put<T>(bin, t);
    }
    write(prefix + ".idx", idx);
    write(prefix + ".bin", bin);
    return prefix;
  }

  template <class T>
  std::string flat(const std::string& name, const std::vector<T>& tokens) const {
    std::string bytes;
    for (T t : tokens) put<T>(bytes, t);
    write(path(name), bytes);
    return path(name);
  }

  static std::vector<std::int64_t> document(const TokenCorpus& c, std::size_t doc) {
    std::vector<std::int64_t> out(c.lengths()[doc]);
    c.read_tokens(doc, 0, out);
    return out;
  }

  fs::path dir_;
};

using Tokens = std::vector<std::int64_t>;

TEST_F(TokenFiles, MegatronDataSetsReadTheirDocumentsInOrder) {
  const auto a = megatron<std::uint16_t>("a", {{1, 2, 3}, {65535, 4}}, 8);
  const auto b = megatron<std::int32_t>("b", {{100000, 7, 8, 9}}, 4);
  const auto c = TokenCorpus::megatron({a, b + ".bin"});
  ASSERT_EQ(c->documents(), 3u);
  EXPECT_EQ(c->tokens(), 9u);
  EXPECT_EQ(std::vector<std::uint32_t>(c->lengths().begin(), c->lengths().end()),
            (std::vector<std::uint32_t>{3, 2, 4}));
  EXPECT_EQ(document(*c, 0), (Tokens{1, 2, 3}));
  EXPECT_EQ(document(*c, 1), (Tokens{65535, 4}));
  EXPECT_EQ(document(*c, 2), (Tokens{100000, 7, 8, 9}));
  EXPECT_EQ(c->document_name(2), b + ".bin document 0");
  Tokens two(2);
  c->read_tokens(2, 1, two);
  EXPECT_EQ(two, (Tokens{7, 8}));
  EXPECT_THROW(c->read_tokens(2, 3, two), std::out_of_range);
}

TEST_F(TokenFiles, FlatFilesSplitAfterEachEndOfDocumentToken) {
  const auto a = flat<std::uint16_t>("a.bin", {5, 6, 0, 7, 0, 8, 9});  // eod 0
  const auto b = flat<std::uint16_t>("b.bin", {3, 0});
  const auto c = TokenCorpus::flat({a, b}, TokenCorpus::FlatDType::u16, 0);
  ASSERT_EQ(c->documents(), 4u);
  EXPECT_EQ(document(*c, 0), (Tokens{5, 6, 0}));
  EXPECT_EQ(document(*c, 1), (Tokens{7, 0}));
  EXPECT_EQ(document(*c, 2), (Tokens{8, 9}));  // the tail after the last eod
  EXPECT_EQ(document(*c, 3), (Tokens{3, 0}));
  EXPECT_EQ(c->document_name(3), b + " document 0");
  const auto w = flat<std::uint32_t>("w.bin", {70000, 4, 99, 1, 99});
  const auto c32 = TokenCorpus::flat({w}, TokenCorpus::FlatDType::u32, 99);
  ASSERT_EQ(c32->documents(), 2u);
  EXPECT_EQ(document(*c32, 0), (Tokens{70000, 4, 99}));
}

TEST_F(TokenFiles, BadMegatronFilesAreNamedByFileAndDocument) {
  const auto good = megatron<std::uint16_t>("good", {{1, 2}, {3, 4, 5}, {6}}, 8);
  // Truncated .bin: the last document runs past its end.
  fs::resize_file(good + ".bin", 10);
  EXPECT_EQ(error_of([&] { TokenCorpus::megatron({good}); }),
            "stoker: " + good + ".bin is truncated: " + good +
                ".bin document 2 ends at byte 12, the file has 10");
  // Longer than the index says: the .idx is another data set's.
  write(good + ".bin", std::string(14, '\0'));
  EXPECT_NE(error_of([&] {
              TokenCorpus::megatron({good});
            }).find(good + ".idx does not match " + good + ".bin"),
            std::string::npos);
  // Bad magic, version and dtype codes; a truncated .idx.
  auto idx = [&](std::size_t at, char value) {
    const auto p = megatron<std::uint16_t>("x", {{1, 2}}, 8);
    std::string s(fs::file_size(p + ".idx"), '\0');
    std::ifstream(p + ".idx", std::ios::binary).read(s.data(), static_cast<long>(s.size()));
    s[at] = value;
    write(p + ".idx", s);
    return error_of([&] { TokenCorpus::megatron({p}); });
  };
  EXPECT_NE(idx(0, 'X').find("x.idx: not a Megatron index"), std::string::npos);
  EXPECT_NE(idx(9, 2).find("x.idx: index version 2"), std::string::npos);
  EXPECT_NE(idx(17, 7).find("x.idx: dtype code 7 is a floating-point type"), std::string::npos);
  EXPECT_NE(idx(17, 9).find("x.idx: unknown dtype code 9"), std::string::npos);
  EXPECT_NE(idx(18, 100).find("x.idx: "), std::string::npos);  // 100 sequences: truncated
  EXPECT_NE(idx(18, 100).find("truncated"), std::string::npos);
  // An empty document.
  const auto empty = megatron<std::uint16_t>("empty", {{1}, {}, {2}}, 8);
  EXPECT_EQ(error_of([&] { TokenCorpus::megatron({empty}); }),
            "stoker: " + empty + ".bin document 1 is empty");
  EXPECT_NE(error_of([&] { TokenCorpus::megatron({path("missing")}); }).find("cannot open"),
            std::string::npos);
}

TEST_F(TokenFiles, BadFlatFilesAreNamedByFileAndDocument) {
  const auto odd = path("odd.bin");
  write(odd, std::string(5, '\1'));
  EXPECT_EQ(error_of([&] { TokenCorpus::flat({odd}, TokenCorpus::FlatDType::u16, 0); }),
            "stoker: " + odd + " is truncated: 5 bytes, not a whole number of 2-byte tokens");
  const auto empty = flat<std::uint16_t>("e.bin", {4, 0, 0, 5});
  EXPECT_EQ(error_of([&] { TokenCorpus::flat({empty}, TokenCorpus::FlatDType::u16, 0); }),
            "stoker: " + empty + " document 1 is empty");
  EXPECT_THROW(TokenCorpus::flat({empty}, TokenCorpus::FlatDType::u16, 70000),
               std::invalid_argument);
}

TEST_F(TokenFiles, AFileTruncatedUnderItsReaderFailsTheReadNamingFileAndDocument) {
  const auto a = flat<std::uint16_t>("a.bin", {1, 2, 0, 3, 4, 5, 0});
  const auto c = TokenCorpus::flat({a}, TokenCorpus::FlatDType::u16, 0);
  fs::resize_file(a, 8);  // document 1 now ends past the file's end: an error, not SIGBUS
  EXPECT_EQ(document(*c, 0), (Tokens{1, 2, 0}));
  EXPECT_EQ(error_of([&] { document(*c, 1); }),
            "stoker: " + a + " is truncated: " + a + " document 1 ends past its 14 bytes");
}

TEST_F(TokenFiles, ManyFilesAreOpenedForEachReadAndFlatFilesAreScannedAcrossBlocks) {
  // More files than are held open (64): each read opens its file.
  std::vector<std::string> paths;
  for (int k = 0; k < 70; ++k) {
    std::string name = "f";
    name += std::to_string(k);
    name += ".bin";
    paths.push_back(flat<std::uint16_t>(name, {static_cast<std::uint16_t>(k + 1), 0}));
  }
  const auto many = TokenCorpus::flat(paths, TokenCorpus::FlatDType::u16, 0);
  ASSERT_EQ(many->documents(), 70u);
  EXPECT_EQ(document(*many, 69), (Tokens{70, 0}));
  // A file of more than one 8 MiB block: documents that cross a block's end are whole.
  std::vector<std::uint32_t> tokens(5'000'000);
  for (std::size_t i = 0; i < tokens.size(); ++i)
    tokens[i] = i % 1'000'003 == 1'000'002 ? 7 : static_cast<std::uint32_t>(i % 5 + 10);
  const auto big =
      TokenCorpus::flat({flat<std::uint32_t>("big.bin", tokens)}, TokenCorpus::FlatDType::u32, 7);
  ASSERT_EQ(big->documents(), 5u);  // four ended by eod, the tail
  EXPECT_EQ(big->lengths()[0], 1'000'003u);
  EXPECT_EQ(big->lengths()[2], 1'000'003u);  // [2'000'006, 3'000'009) crosses 8 MiB (2,097,152)
  EXPECT_EQ(big->lengths()[4], 5'000'000u - 4 * 1'000'003u);
  Tokens last(1);
  big->read_tokens(1, 1'000'002, last);
  EXPECT_EQ(last, (Tokens{7}));
}

TEST_F(TokenFiles, ATokenPastTheVocabularyFailsItsReadNamingFileAndDocument) {
  const auto a = flat<std::uint16_t>("a.bin", {1, 2, 0, 3, 500, 0});
  const auto c = TokenCorpus::flat({a}, TokenCorpus::FlatDType::u16, 0, 100);
  EXPECT_EQ(document(*c, 0), (Tokens{1, 2, 0}));
  EXPECT_EQ(error_of([&] { document(*c, 1); }),
            "stoker: " + a + " document 1: token 1 is 500, outside the vocabulary of 100");
}

TEST(TokenColumns, ListColumnsInMemoryAreDocumentsNamedBySourceAndRow) {
  // Two chunks as Arrow holds a list column: values and rows + 1 offsets (the second chunk's
  // offsets start past its values' start, as a sliced Arrow array's do).
  auto values32 =
      std::make_shared<std::vector<std::int32_t>>(std::vector<std::int32_t>{5, 6, 7, 8, 9, 10});
  auto values64 =
      std::make_shared<std::vector<std::uint64_t>>(std::vector<std::uint64_t>{99, 99, 1, 2, 3});
  const std::vector<std::int64_t> off_a{0, 3, 4, 6}, off_b{2, 3, 5};
  std::vector<TokenCorpus::Column> cols(2);
  cols[0] = {"a.parquet column input_ids", 0, TokenCorpus::IdType::i32, values32->data(), off_a};
  cols[1] = {"a.parquet column input_ids", 3, TokenCorpus::IdType::u64, values64->data(), off_b};
  std::weak_ptr<std::vector<std::int32_t>> watch = values32;
  auto owner = std::make_shared<std::pair<decltype(values32), decltype(values64)>>(
      std::move(values32), std::move(values64));
  const auto c = TokenCorpus::columns(cols, std::move(owner), 100);
  ASSERT_EQ(c->documents(), 5u);
  EXPECT_EQ(c->tokens(), 9u);
  EXPECT_EQ(std::vector<std::uint32_t>(c->lengths().begin(), c->lengths().end()),
            (std::vector<std::uint32_t>{3, 1, 2, 1, 2}));
  auto doc = [&](std::size_t d) {
    std::vector<std::int64_t> out(c->lengths()[d]);
    c->read_tokens(d, 0, out);
    return out;
  };
  EXPECT_EQ(doc(0), (std::vector<std::int64_t>{5, 6, 7}));
  EXPECT_EQ(doc(2), (std::vector<std::int64_t>{9, 10}));
  EXPECT_EQ(doc(3), (std::vector<std::int64_t>{1}));
  EXPECT_EQ(doc(4), (std::vector<std::int64_t>{2, 3}));
  EXPECT_EQ(c->document_name(4), "a.parquet column input_ids row 4");
  EXPECT_FALSE(watch.expired());  // the corpus keeps the columns' memory
  // The packed rows read them like any source.
  TokenRowsOptions o;
  o.pack.seq_len = 4;
  o.pack.shuffle_documents = false;
  const TokenRows rows(c, o);
  ASSERT_EQ(rows.size(), 2u);
  std::vector<std::int64_t> first(rows.plan().seq_len);
  std::size_t at = 0;
  for (const auto& p : rows.plan().row(0)) {
    c->read_tokens(p.doc, p.offset, std::span(first).subspan(at, p.length));
    at += p.length;
  }
  EXPECT_EQ(first, (std::vector<std::int64_t>{5, 6, 7, 8}));
}

TEST(TokenColumns, BadRowsAndTokensPastTheVocabularyAreNamedBySourceAndRow) {
  const std::vector<std::int64_t> values{1, 2, 3, 400};
  const std::vector<std::int64_t> empty_row{0, 2, 2, 4}, backwards{0, 3, 2};
  std::vector<TokenCorpus::Column> cols{
      {"t.parquet column ids", 10, TokenCorpus::IdType::i64, values.data(), empty_row}};
  EXPECT_EQ(error_of([&] { TokenCorpus::columns(cols, nullptr); }),
            "stoker: t.parquet column ids row 11 is empty");
  cols[0].offsets = backwards;
  EXPECT_EQ(error_of([&] { TokenCorpus::columns(cols, nullptr); }),
            "stoker: t.parquet column ids row 11: offsets 3 to 2 do not follow each other");
  const std::vector<std::int64_t> good{0, 2, 4};
  cols[0].offsets = good;
  const auto c = TokenCorpus::columns(cols, nullptr, 100);
  std::vector<std::int64_t> out(2);
  EXPECT_EQ(error_of([&] { c->read_tokens(1, 0, out); }),
            "stoker: t.parquet column ids row 11: token 1 is 400, outside the vocabulary of 100");
  EXPECT_THROW(TokenCorpus::columns({}, nullptr), std::invalid_argument);
}

// ---- Rows ---------------------------------------------------------------------------------

struct Row {
  Tokens ids, labels, positions, docs;
  std::vector<std::int32_t> cu;
};

Row read_row(const TokenRows& rows, std::size_t index) {
  const auto f = rows.fields();
  Row r;
  r.ids.resize(f[0].elements());
  r.labels.resize(f[1].elements());
  r.positions.resize(f[2].elements());
  r.docs.resize(f[3].elements());
  r.cu.resize(f[4].elements());
  std::vector<std::size_t> bytes;
  for (const auto& s : f) bytes.push_back(s.bytes());
  std::byte* bases[] = {
      reinterpret_cast<std::byte*>(r.ids.data()), reinterpret_cast<std::byte*>(r.labels.data()),
      reinterpret_cast<std::byte*>(r.positions.data()), reinterpret_cast<std::byte*>(r.docs.data()),
      reinterpret_cast<std::byte*>(r.cu.data())};
  rows.read(index, SampleOut(bytes, bases, 0, 0));
  return r;
}

TEST_F(TokenFiles, BestFitRowsCarryLabelsPositionsDocumentsAndSegmentBoundaries) {
  // Documents 0: 10 11 12 1 | 1: 20 21 1 | 2: 30 1 (eod 1), seq_len 6, corpus order:
  // row 0 = doc 0 + doc 2 (the best fit for 2 tokens is the room of 2), row 1 = doc 1 + pad.
  const auto a = flat<std::uint16_t>("a.bin", {10, 11, 12, 1, 20, 21, 1, 30, 1});
  TokenRowsOptions o;
  o.pack.mode = TokenPackOptions::Mode::best_fit;
  o.pack.seq_len = 6;
  o.pack.shuffle_documents = false;
  o.pad_id = 7;
  const TokenRows rows(TokenCorpus::flat({a}, TokenCorpus::FlatDType::u16, 1), o);
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows.max_segments(), 3u);  // 2 pieces at most, and one for the padding
  const auto r0 = read_row(rows, 0);
  EXPECT_EQ(r0.ids, (Tokens{10, 11, 12, 1, 30, 1}));
  EXPECT_EQ(r0.labels, (Tokens{11, 12, 1, -100, 1, -100}));
  EXPECT_EQ(r0.positions, (Tokens{0, 1, 2, 3, 0, 1}));
  EXPECT_EQ(r0.docs, (Tokens{0, 0, 0, 0, 2, 2}));
  EXPECT_EQ(r0.cu, (std::vector<std::int32_t>{0, 4, 6, 6}));
  const auto r1 = read_row(rows, 1);
  EXPECT_EQ(r1.ids, (Tokens{20, 21, 1, 7, 7, 7}));
  EXPECT_EQ(r1.labels, (Tokens{21, 1, -100, -100, -100, -100}));
  EXPECT_EQ(r1.positions, (Tokens{0, 1, 2, 0, 0, 0}));
  EXPECT_EQ(r1.docs, (Tokens{1, 1, 1, -1, -1, -1}));
  EXPECT_EQ(r1.cu, (std::vector<std::int32_t>{0, 3, 6, 6}));
  EXPECT_EQ(rows.sample_name(0), "row 0 (" + a + " document 0 and 1 more)");

  o.labels = TokenRowsOptions::Labels::same;
  const TokenRows same(TokenCorpus::flat({a}, TokenCorpus::FlatDType::u16, 1), o);
  EXPECT_EQ(read_row(same, 0).labels, (Tokens{-100, 11, 12, 1, -100, 1}));
  o.max_segments = 1;
  EXPECT_THROW(TokenRows(TokenCorpus::flat({a}, TokenCorpus::FlatDType::u16, 1), o),
               std::invalid_argument);
}

TEST_F(TokenFiles, ConcatenatedRowsLabelTheTokenAfterTheRowAsMegatronDoes) {
  // One document of 7 tokens and one of 3, seq_len 4: rows [0..4) and [4..8) of the stream.
  const auto p = megatron<std::int32_t>("m", {{1, 2, 3, 4, 5, 6, 7}, {8, 9, 10}}, 4);
  TokenRowsOptions o;
  o.pack.seq_len = 4;
  o.pack.shuffle_documents = false;
  const TokenRows rows(TokenCorpus::megatron({p}), o);
  ASSERT_EQ(rows.size(), 2u);
  const auto r0 = read_row(rows, 0);
  EXPECT_EQ(r0.ids, (Tokens{1, 2, 3, 4}));
  EXPECT_EQ(r0.labels, (Tokens{2, 3, 4, 5}));                 // the 5 is the next row's first token
  EXPECT_EQ(r0.cu, (std::vector<std::int32_t>{0, 4, 4, 4}));  // fill: empty segments
  const auto r1 = read_row(rows, 1);
  EXPECT_EQ(r1.ids, (Tokens{5, 6, 7, 8}));
  EXPECT_EQ(r1.labels, (Tokens{6, 7, -100, 9}));
  EXPECT_EQ(r1.positions, (Tokens{0, 1, 2, 0}));
  EXPECT_EQ(r1.docs, (Tokens{0, 0, 0, 1}));
  EXPECT_EQ(r1.cu, (std::vector<std::int32_t>{0, 3, 4, 4}));
}

TEST_F(TokenFiles, RowsReadConcurrentlyEqualRowsReadOneByOne) {
  std::vector<std::uint16_t> tokens;
  std::mt19937 rng(3);
  for (int i = 0; i < 20000; ++i) tokens.push_back(static_cast<std::uint16_t>(1 + rng() % 50));
  for (std::size_t i = 5; i < tokens.size(); i += 2 + rng() % 300) tokens[i] = 0;
  const auto a = flat<std::uint16_t>("a.bin", tokens);
  TokenRowsOptions o;
  o.pack.mode = TokenPackOptions::Mode::best_fit;
  o.pack.seq_len = 256;
  const TokenRows rows(TokenCorpus::flat({a}, TokenCorpus::FlatDType::u16, 0, 51), o);
  std::vector<Tokens> serial;
  for (std::size_t i = 0; i < rows.size(); ++i) serial.push_back(read_row(rows, i).ids);
  std::vector<Tokens> parallel(rows.size());
  std::vector<std::thread> threads;
  for (std::size_t t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (std::size_t i = t; i < rows.size(); i += 4) parallel[i] = read_row(rows, i).ids;
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(parallel, serial);
}

TEST_F(TokenFiles, AMixReadsEachSamplesRowFromItsSourceAndSaysWhichSource) {
  std::vector<std::uint16_t> ta, tb;
  for (int i = 0; i < 400; ++i)
    ta.push_back(static_cast<std::uint16_t>(i % 7 == 6 ? 0 : 100 + i % 7));
  for (int i = 0; i < 100; ++i)
    tb.push_back(static_cast<std::uint16_t>(i % 5 == 4 ? 0 : 200 + i % 5));
  const auto a = flat<std::uint16_t>("a.bin", ta);
  const auto b = flat<std::uint16_t>("b.bin", tb);
  TokenRowsOptions o;
  o.pack.seq_len = 8;
  o.max_segments = 4;
  auto ra =
      std::make_shared<const TokenRows>(TokenCorpus::flat({a}, TokenCorpus::FlatDType::u16, 0), o);
  auto rb =
      std::make_shared<const TokenRows>(TokenCorpus::flat({b}, TokenCorpus::FlatDType::u16, 0), o);
  TokenMixOptions m;
  m.weights = {1, 1};
  m.batch = 4;
  m.seed = 2;
  const TokenMix mix({ra, rb}, m);
  EXPECT_EQ(mix.size(), ra->size() + rb->size());  // by default, as many samples as rows
  const auto f = mix.fields();
  ASSERT_EQ(f.size(), 6u);
  EXPECT_EQ(f[5].name, "source");
  std::size_t wrapped = 0;
  for (std::size_t i = 0; i < mix.size(); ++i) {
    const auto s = mix.index().source[i];
    const auto row = mix.index().row[i];
    Row r;
    r.ids.resize(8);
    r.labels.resize(8);
    r.positions.resize(8);
    r.docs.resize(8);
    r.cu.resize(5);
    std::int64_t source = -1;
    std::vector<std::size_t> bytes;
    for (const auto& x : f) bytes.push_back(x.bytes());
    std::byte* bases[] = {reinterpret_cast<std::byte*>(r.ids.data()),
                          reinterpret_cast<std::byte*>(r.labels.data()),
                          reinterpret_cast<std::byte*>(r.positions.data()),
                          reinterpret_cast<std::byte*>(r.docs.data()),
                          reinterpret_cast<std::byte*>(r.cu.data()),
                          reinterpret_cast<std::byte*>(&source)};
    mix.read(i, SampleOut(bytes, bases, 0, 0));
    EXPECT_EQ(source, s);
    EXPECT_EQ(r.ids, read_row(s == 0 ? *ra : *rb, row).ids) << "sample " << i;
    wrapped += s == 1 && mix.index().epochs[1] > 1;
  }
  EXPECT_GT(wrapped, 0u);  // source 1 (fewer rows, the same weight) wrapped around
  EXPECT_NE(mix.sample_name(0).find("source "), std::string::npos);
  o.max_segments = 5;
  auto other =
      std::make_shared<const TokenRows>(TokenCorpus::flat({b}, TokenCorpus::FlatDType::u16, 0), o);
  EXPECT_THROW(TokenMix({ra, other}, m), std::invalid_argument);  // unlike rows
}

// ---- The mix's index cache -----------------------------------------------------------------

class TokenMixCache : public TokenFiles {
 protected:
  // Two flat sources (50 and 12 rows of seq_len 8; with seq_len 4, 100 and 25).
  void SetUp() override {
    TokenFiles::SetUp();
    std::vector<std::uint16_t> ta, tb;
    for (int i = 0; i < 400; ++i)
      ta.push_back(static_cast<std::uint16_t>(i % 7 == 6 ? 0 : 100 + i % 7));
    for (int i = 0; i < 100; ++i)
      tb.push_back(static_cast<std::uint16_t>(i % 5 == 4 ? 0 : 200 + i % 5));
    a_ = flat<std::uint16_t>("a.bin", ta);
    b_ = flat<std::uint16_t>("b.bin", tb);
  }

  struct Inputs {
    std::size_t seq_len = 8;
    std::vector<double> weights = {2, 1};
    std::vector<TokenWeightStep> schedule;  // instead of the weights, where given
    TokenMixing mixing = TokenMixing::stratified;
    std::uint64_t seed = 3;
    bool cache = true;
  };
  // A mix of 70,000 samples (enough to be cached) of the two sources.
  TokenMix mix(const Inputs& in) const {
    TokenRowsOptions o;
    o.pack.seq_len = in.seq_len;
    o.max_segments = 4;
    std::vector<std::shared_ptr<const TokenRows>> sources;
    for (const auto& f : {a_, b_}) {
      sources.push_back(std::make_shared<const TokenRows>(
          TokenCorpus::flat({f}, TokenCorpus::FlatDType::u16, 0), o));
    }
    TokenMixOptions m;
    if (in.schedule.empty()) {
      m.weights = in.weights;
    } else {
      m.schedule = in.schedule;
    }
    m.mixing = in.mixing;
    m.batch = 64;
    m.samples = 70'000;
    m.seed = in.seed;
    m.index_cache_dir = cache_dir();
    m.index_cache = in.cache;
    return TokenMix(std::move(sources), m);
  }
  std::string cache_dir() const { return path("cache"); }
  std::vector<std::string> entries() const {
    std::vector<std::string> out;
    if (!fs::exists(cache_dir())) return out;
    for (const auto& e : fs::directory_iterator(cache_dir())) {
      if (e.path().extension() == ".mix") out.push_back(e.path().string());
    }
    return out;
  }
  static void expect_same(const TokenMix& got, const TokenMix& want) {
    EXPECT_EQ(got.index().source, want.index().source);
    EXPECT_EQ(got.index().row, want.index().row);
    EXPECT_EQ(got.index().epochs, want.index().epochs);
  }

  std::string a_, b_;
};

TEST_F(TokenMixCache, ASecondMixWithTheSameInputsLoadsItsBlendIndexFromTheCache) {
  const TokenMix first = mix({});
  EXPECT_FALSE(first.index_from_cache());
  ASSERT_EQ(entries().size(), 1u);
  const TokenMix second = mix({});
  EXPECT_TRUE(second.index_from_cache());
  Inputs fresh;
  fresh.cache = false;
  const TokenMix built = mix(fresh);
  EXPECT_FALSE(built.index_from_cache());
  expect_same(second, built);
  expect_same(first, built);
  EXPECT_EQ(entries().size(), 1u);
}

TEST_F(TokenMixCache, AChangedWeightSeedSeqLenMixingOrSourceFileBuildsTheIndexAgain) {
  mix({});
  std::vector<Inputs> changed(4);
  changed[0].weights = {2, 1.5};
  changed[1].seed = 4;
  changed[2].seq_len = 4;
  changed[3].mixing = TokenMixing::iid;
  for (std::size_t k = 0; k < changed.size(); ++k) {
    const TokenMix m = mix(changed[k]);
    EXPECT_FALSE(m.index_from_cache()) << "change " << k;
    Inputs fresh = changed[k];
    fresh.cache = false;
    expect_same(m, mix(fresh));
    EXPECT_TRUE(mix(changed[k]).index_from_cache()) << "change " << k << ", made again";
  }
  // The same rows from a source file written again (its mtime, and here its size, differ).
  std::vector<std::uint16_t> tb;
  for (int i = 0; i < 101; ++i)
    tb.push_back(static_cast<std::uint16_t>(i % 5 == 4 ? 0 : 300 + i % 5));
  flat<std::uint16_t>("b.bin", tb);
  EXPECT_FALSE(mix({}).index_from_cache());
  EXPECT_TRUE(mix({}).index_from_cache());
  EXPECT_EQ(entries().size(), 6u);
}

TEST_F(TokenMixCache, AScheduleIsInTheKeyAndOneOfASingleSegmentIsThePlainWeights) {
  mix({});
  Inputs one;  // the plain weights as a schedule (its later segment changes nothing)
  one.schedule = {{0, {2, 1}}, {300, {2, 1}}};
  EXPECT_TRUE(mix(one).index_from_cache());
  Inputs changed;
  changed.schedule = {{0, {2, 1}}, {300, {1, 1}}};
  const TokenMix m = mix(changed);
  EXPECT_FALSE(m.index_from_cache());
  EXPECT_TRUE(mix(changed).index_from_cache());
  Inputs later = changed;  // the same segments, the change at another step
  later.schedule[1].step = 301;
  EXPECT_FALSE(mix(later).index_from_cache());
  Inputs fresh = changed;
  fresh.cache = false;
  expect_same(m, mix(fresh));
  EXPECT_EQ(entries().size(), 3u);
  // Weights and a schedule both: which holds is not clear.
  TokenRowsOptions o;
  o.pack.seq_len = 8;
  std::vector<std::shared_ptr<const TokenRows>> sources;
  for (const auto& f : {a_, b_}) {
    sources.push_back(std::make_shared<const TokenRows>(
        TokenCorpus::flat({f}, TokenCorpus::FlatDType::u16, 0), o));
  }
  TokenMixOptions opt;
  opt.weights = {2, 1};
  opt.schedule = {{0, {2, 1}}};
  EXPECT_THROW(TokenMix(sources, opt), std::invalid_argument);
}

TEST_F(TokenMixCache, ADamagedOrTruncatedCacheEntryIsBuiltAgainAndNamedInALogLine) {
  Inputs fresh;
  fresh.cache = false;
  const TokenMix want = mix(fresh);
  mix({});
  const auto files = entries();
  ASSERT_EQ(files.size(), 1u);
  const std::string file = files[0];
  std::vector<std::string> lines;
  set_log_handler([&](LogLevel, std::string_view line) { lines.emplace_back(line); });
  const auto size = fs::file_size(file);
  fs::resize_file(file, size / 2);  // cut short
  const TokenMix truncated = mix({});
  EXPECT_FALSE(truncated.index_from_cache());
  expect_same(truncated, want);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_NE(lines[0].find(file), std::string::npos) << lines[0];
  EXPECT_TRUE(mix({}).index_from_cache());  // written again whole
  {
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(static_cast<std::streamoff>(size / 2));
    const char c = static_cast<char>(f.get());
    f.seekp(static_cast<std::streamoff>(size / 2));
    f.put(static_cast<char>(~c));  // a byte of the rows flipped
  }
  const TokenMix damaged = mix({});
  EXPECT_FALSE(damaged.index_from_cache());
  expect_same(damaged, want);
  EXPECT_EQ(lines.size(), 2u);
  set_log_handler({});
  EXPECT_TRUE(mix({}).index_from_cache());
}

}  // namespace
}  // namespace stoker
