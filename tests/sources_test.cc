#include "stoker/sources.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>

#include "stoker/loader.h"

namespace stoker {
namespace {

SyntheticDataset::Options heavy_like(std::size_t n) {
  SyntheticDataset::Options o;
  o.samples = n;
  o.fields = {{"x", DType::f32, {3, 4, 5}}, {"label", DType::i64, {}}, {"raw", DType::u8, {9}}};
  return o;
}

TEST(SyntheticDataset, ContentFollowsTheDocumentedFormula) {
  SyntheticDataset ds(heavy_like(300));
  std::vector<float> x(60);
  std::int64_t label = 0;
  std::vector<std::uint8_t> raw(9);
  const std::size_t field_bytes[] = {240, 8, 9};
  for (std::size_t i : {0, 1, 7, 299}) {
    std::byte* bases[] = {reinterpret_cast<std::byte*>(x.data()),
                          reinterpret_cast<std::byte*>(&label),
                          reinterpret_cast<std::byte*>(raw.data())};
    ds.read(i, SampleOut(field_bytes, bases, 0, 0));
    for (std::size_t j = 0; j < 60; ++j) {
      ASSERT_EQ(x[j], static_cast<float>((i * 131 + j * 7) % 1000) / 1000.0f) << i << " " << j;
    }
    EXPECT_EQ(label, static_cast<std::int64_t>(i % 10));
    for (std::size_t j = 0; j < 9; ++j) ASSERT_EQ(raw[j], (i * 131 + j * 7) & 255);
  }
}

TEST(SyntheticDataset, RefusesHalfFloatsAndBadIndices) {
  auto o = heavy_like(3);
  o.fields.push_back({"h", DType::f16, {2}});
  EXPECT_THROW(SyntheticDataset{o}, std::invalid_argument);
  SyntheticDataset ds(heavy_like(3));
  std::vector<std::byte> buf(512);
  const std::size_t field_bytes[] = {240, 8, 9};
  std::byte* bases[] = {buf.data(), buf.data() + 256, buf.data() + 300};
  EXPECT_THROW(ds.read(3, SampleOut(field_bytes, bases, 0, 0)), std::out_of_range);
}

TEST(SyntheticDataset, LatencyIsSleptPerSample) {
  auto o = heavy_like(8);
  o.latency = std::chrono::milliseconds(2);
  LoaderOptions lo;
  lo.dataset = std::make_shared<SyntheticDataset>(o);
  lo.batch_size = 8;
  lo.workers = 0;
  Loader loader(lo);
  ASSERT_TRUE(loader.next());
  // Correctness, not speed: the inline reader spent at least the sleeps it was asked for.
  EXPECT_GE(loader.stats().inline_busy, std::chrono::milliseconds(16));
}

TEST(ArrayDataset, MaterializedCopyReadsTheSameBytes) {
  SyntheticDataset synthetic(heavy_like(50));
  auto arrays = ArrayDataset::materialize(synthetic);
  ASSERT_EQ(arrays->size(), 50u);
  LoaderOptions a;
  a.dataset = arrays;
  a.batch_size = 7;
  a.shuffle = true;
  LoaderOptions b = a;
  b.dataset = std::make_shared<SyntheticDataset>(heavy_like(50));
  Loader la(a), lb(b);
  while (auto x = la.next()) {
    auto y = lb.next();
    ASSERT_TRUE(y);
    for (std::size_t f = 0; f < 3; ++f) {
      ASSERT_EQ(x->bytes(f).size(), y->bytes(f).size());
      EXPECT_TRUE(std::equal(x->bytes(f).begin(), x->bytes(f).end(), y->bytes(f).begin()));
    }
  }
}

TEST(ArrayDataset, RejectsArraysOfTheWrongSize) {
  std::vector<std::byte> data(10);
  EXPECT_THROW(
      ArrayDataset({{"a", DType::f32, {2}}}, {std::span<const std::byte>(data)}, 2, nullptr),
      std::invalid_argument);
  EXPECT_THROW(ArrayDataset({{"a", DType::u8, {5}}}, {}, 2, nullptr), std::invalid_argument);
}

}  // namespace
}  // namespace stoker
