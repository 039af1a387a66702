// Packing documents into rows as an index: plan_rows() (stoker/tokens.h), a pure function.
#include <algorithm>
#include <bit>
#include <cmath>
#include <numeric>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "sampler/sampler.h"
#include "stoker/tokens.h"
#include "util/parallel.h"

namespace stoker {
namespace {

constexpr std::size_t kMaxSeqLen = std::size_t{1} << 24;

std::vector<std::size_t> document_order(std::size_t n, const TokenPackOptions& o) {
  std::vector<std::size_t> order;
  if (o.shuffle_documents) {
    detail::permutation(n, o.seed, order);
  } else {
    order.resize(n);
    std::iota(order.begin(), order.end(), std::size_t{0});
  }
  return order;
}

TokenPlan plan_concat(std::span<const std::uint32_t> lengths, const std::vector<std::size_t>& order,
                      std::size_t seq_len) {
  TokenPlan plan;
  plan.seq_len = seq_len;
  std::uint64_t total = 0;
  for (auto n : lengths) total += n;
  const std::uint64_t rows = total / seq_len;
  plan.row_starts.reserve(rows + 1);
  plan.pieces.reserve(lengths.size() + rows);
  plan.row_starts.push_back(0);
  std::size_t k = 0;         // position in `order`
  std::uint32_t offset = 0;  // tokens of document order[k] already placed
  for (std::uint64_t r = 0; r < rows; ++r) {
    std::size_t room = seq_len;
    while (room > 0) {
      const std::size_t doc = order[k];
      const std::uint32_t left = lengths[doc] - offset;
      const auto take = static_cast<std::uint32_t>(std::min<std::size_t>(left, room));
      plan.pieces.push_back({doc, offset, take});
      room -= take;
      offset += take;
      if (offset == lengths[doc]) {
        ++k;
        offset = 0;
      }
    }
    const std::uint64_t start = plan.row_starts.back();
    plan.max_pieces = std::max<std::size_t>(plan.max_pieces, plan.pieces.size() - start);
    plan.row_starts.push_back(plan.pieces.size());
  }
  plan.tokens = rows * seq_len;
  return plan;
}

// The open rows by free room: bucket c holds the rows with c tokens of room (a stack, so the
// most recently opened of equal rows is filled first), and a bitmap says which buckets hold
// any. The best fit for n tokens is the first set bit at or after n.
class FreeRoom {
 public:
  explicit FreeRoom(std::size_t seq_len) : buckets_(seq_len + 1), bits_(seq_len / 64 + 1, 0) {}

  // The room of the open row with the least room >= n, or 0 when none has.
  std::size_t best(std::size_t n) const {
    std::size_t w = n / 64;
    std::uint64_t word = bits_[w] & (~std::uint64_t{0} << (n % 64));
    while (word == 0) {
      if (++w == bits_.size()) return 0;
      word = bits_[w];
    }
    return w * 64 + static_cast<std::size_t>(std::countr_zero(word));
  }
  std::uint64_t take(std::size_t room) {
    auto& b = buckets_[room];
    const std::uint64_t row = b.back();
    b.pop_back();
    if (b.empty()) bits_[room / 64] &= ~(std::uint64_t{1} << (room % 64));
    return row;
  }
  void put(std::size_t room, std::uint64_t row) {
    buckets_[room].push_back(row);
    bits_[room / 64] |= std::uint64_t{1} << (room % 64);
  }

 private:
  std::vector<std::vector<std::uint64_t>> buckets_;
  std::vector<std::uint64_t> bits_;
};

TokenPlan plan_best_fit(std::span<const std::uint32_t> lengths,
                        const std::vector<std::size_t>& order, const TokenPackOptions& o) {
  const std::size_t seq_len = o.seq_len;
  struct Placed {
    std::uint64_t row;
    TokenPiece piece;
  };
  std::vector<Placed> placed;
  placed.reserve(lengths.size() + lengths.size() / 8);
  std::vector<std::uint32_t> row_pieces;  // pieces per row
  FreeRoom free(seq_len);
  std::uint64_t tokens = 0;
  auto place = [&](std::size_t doc, std::uint32_t offset, std::uint32_t n) {
    std::size_t room = free.best(n);
    std::uint64_t row;
    if (room == 0) {
      row = row_pieces.size();
      row_pieces.push_back(0);
      room = seq_len;
    } else {
      row = free.take(room);
    }
    placed.push_back({row, {doc, offset, n}});
    ++row_pieces[row];
    tokens += n;
    if (room > n) free.put(room - n, row);
  };
  for (const std::size_t doc : order) {
    const std::uint32_t n = lengths[doc];
    if (n <= seq_len) {
      place(doc, 0, n);
    } else if (o.long_documents == TokenPackOptions::Long::truncate) {
      place(doc, 0, static_cast<std::uint32_t>(seq_len));
    } else {
      for (std::uint32_t off = 0; off < n; off += static_cast<std::uint32_t>(seq_len)) {
        place(doc, off, static_cast<std::uint32_t>(std::min<std::size_t>(n - off, seq_len)));
      }
    }
  }
  // The pieces grouped by row, in the order they were placed (a counting sort).
  TokenPlan plan;
  plan.seq_len = seq_len;
  plan.tokens = tokens;
  plan.row_starts.assign(row_pieces.size() + 1, 0);
  for (std::size_t r = 0; r < row_pieces.size(); ++r) {
    plan.row_starts[r + 1] = plan.row_starts[r] + row_pieces[r];
    plan.max_pieces = std::max<std::size_t>(plan.max_pieces, row_pieces[r]);
  }
  plan.pieces.resize(placed.size());
  std::vector<std::uint64_t> next(plan.row_starts.begin(), plan.row_starts.end() - 1);
  for (const auto& p : placed) plan.pieces[next[p.row]++] = p.piece;
  return plan;
}

}  // namespace

double TokenPlan::fill() const {
  const double slots = static_cast<double>(rows()) * static_cast<double>(seq_len);
  return slots == 0 ? 0.0 : static_cast<double>(tokens) / slots;
}

TokenPlan plan_rows(std::span<const std::uint32_t> lengths, const TokenPackOptions& options) {
  if (options.seq_len == 0 || options.seq_len > kMaxSeqLen) {
    throw std::invalid_argument("stoker: seq_len must be in 1.." + std::to_string(kMaxSeqLen) +
                                ", not " + std::to_string(options.seq_len));
  }
  for (std::size_t d = 0; d < lengths.size(); ++d) {
    if (lengths[d] == 0) {
      throw std::invalid_argument("stoker: document " + std::to_string(d) + " is empty");
    }
  }
  const auto order = document_order(lengths.size(), options);
  if (options.mode == TokenPackOptions::Mode::concat) {
    return plan_concat(lengths, order, options.seq_len);
  }
  return plan_best_fit(lengths, order, options);
}

}  // namespace stoker

namespace stoker {

namespace {

// The threads a blend is built on (0: the machine's).
std::size_t threads_of(std::size_t threads) {
  return threads != 0 ? threads : std::max(1u, std::thread::hardware_concurrency());
}

// Samples a parallel task of a blend takes at least, so that handing them out costs nothing.
constexpr std::size_t kTaskSamples = std::size_t{1} << 16;

// The weights' sum; throws std::invalid_argument for no weights, a negative or non-finite
// one, or all of them 0, the message ending with `where` (e.g. " in the schedule's segment at
// step 100").
double weight_sum(std::span<const double> weights, const std::string& where = {}) {
  if (weights.empty()) throw std::invalid_argument("stoker: no sources to blend" + where);
  double sum = 0;
  for (std::size_t s = 0; s < weights.size(); ++s) {
    if (!std::isfinite(weights[s]) || weights[s] < 0) {
      throw std::invalid_argument("stoker: source " + std::to_string(s) + "'s weight " +
                                  std::to_string(weights[s]) + " is not a non-negative number" +
                                  where);
    }
    sum += weights[s];
  }
  if (sum <= 0) throw std::invalid_argument("stoker: every source's weight is 0" + where);
  return sum;
}

// " in the schedule's segment at step S", or nothing for a schedule of one segment given as
// plain weights (`name_steps` false).
std::string segment_name(const TokenWeightStep& segment, bool name_steps) {
  return name_steps ? " in the weight schedule's segment at step " + std::to_string(segment.step)
                    : std::string();
}

// checked_schedule(), naming segments by their steps or (plain weights) not.
std::vector<TokenWeightStep> check_schedule(std::span<const TokenWeightStep> schedule,
                                            std::size_t sources, bool name_steps) {
  if (schedule.empty()) {
    throw std::invalid_argument("stoker: a weight schedule needs a segment at step 0");
  }
  if (schedule[0].step != 0) {
    throw std::invalid_argument(
        "stoker: a weight schedule starts at step 0 (its first segment's weights hold from the "
        "first global batch), not at step " +
        std::to_string(schedule[0].step));
  }
  const std::size_t n = sources != 0 ? sources : schedule[0].weights.size();
  std::vector<TokenWeightStep> out;
  for (std::size_t k = 0; k < schedule.size(); ++k) {
    const TokenWeightStep& seg = schedule[k];
    if (k > 0 && seg.step <= schedule[k - 1].step) {
      throw std::invalid_argument("stoker: a weight schedule's steps must increase: step " +
                                  std::to_string(seg.step) + " follows step " +
                                  std::to_string(schedule[k - 1].step));
    }
    if (seg.weights.size() != n) {
      throw std::invalid_argument("stoker: " + std::to_string(seg.weights.size()) +
                                  " weights for " + std::to_string(n) + " sources" +
                                  segment_name(seg, name_steps || k > 0));
    }
    weight_sum(seg.weights, segment_name(seg, name_steps || k > 0));
    if (k > 0 && seg.weights == out.back().weights) continue;  // no change
    out.push_back(seg);
  }
  return out;
}

// The one-segment schedule of plain weights.
std::vector<TokenWeightStep> plain(std::span<const double> weights) {
  return {TokenWeightStep{0, std::vector<double>(weights.begin(), weights.end())}};
}

// The first sample of step `step` of `batch` samples, or `samples` when that is past them.
std::size_t step_start(std::size_t step, std::size_t batch, std::size_t samples) {
  if (step == 0) return 0;
  return batch == 0 || step > samples / batch ? samples : std::min(samples, step * batch);
}

// A batch's sources (`slots`, one a sample) into `source` and `draw` from sample `at`, in an
// order shuffled by (seed, batch `b`), each sample numbered among its source's so far
// (`count`); `order` is scratch.
void put_batch(std::span<const std::uint32_t> slots, std::uint64_t seed, std::size_t b,
               std::uint64_t* count, std::vector<std::size_t>& order, std::size_t at,
               TokenBlend& blend) {
  detail::permutation(slots.size(), detail::mix(seed, b), order);
  for (const std::size_t i : order) {
    const std::uint32_t s = slots[i];
    blend.source[at] = s;
    blend.draw[at] = count[s]++;
    ++at;
  }
}

}  // namespace

namespace {

// A segment of a stratified blend: batches [start, end), each source's share of a batch, its
// whole samples, the sources whose share is not whole and the extras each batch takes (batch
// b's at extras[at + (b - start) * need ...]).
struct Stratum {
  std::size_t start = 0, end = 0;
  std::vector<double> share;
  std::vector<std::size_t> whole;
  std::vector<std::size_t> fractional;
  std::size_t need = 0;
  std::size_t at = 0;
};

Stratum stratum(const TokenWeightStep& seg, std::size_t end, std::size_t batch) {
  const double sum = weight_sum(seg.weights);
  const std::size_t n = seg.weights.size();
  Stratum t;
  t.start = seg.step;
  t.end = end;
  t.share = std::vector<double>(n);
  t.whole = std::vector<std::size_t>(n);
  std::size_t wholes = 0;
  for (std::size_t s = 0; s < n; ++s) {
    t.share[s] = seg.weights[s] / sum * static_cast<double>(batch);
    t.whole[s] = static_cast<std::size_t>(std::floor(t.share[s]));
    wholes += t.whole[s];
    if (t.share[s] > static_cast<double>(t.whole[s])) t.fractional.push_back(s);
  }
  if (wholes > batch) {
    throw std::logic_error("stoker: stratified_blend's whole shares fill " +
                           std::to_string(wholes) + " of a batch's " + std::to_string(batch) +
                           " samples");
  }
  t.need = batch - wholes;  // each batch's extra samples
  // Fewer extras than such sources: their fractions sum to the extras, each below 1.
  if (t.need > t.fractional.size()) {
    throw std::logic_error("stoker: stratified_blend filled " +
                           std::to_string(wholes + t.fractional.size()) + " of a batch's " +
                           std::to_string(batch) + " samples");
  }
  return t;
}

// stratified_blend() of a checked schedule.
TokenBlend stratified_blend_of(const std::vector<TokenWeightStep>& segs, std::size_t batch,
                               std::size_t batches, std::uint64_t seed, std::size_t threads) {
  if (batch == 0) throw std::invalid_argument("stoker: a blend's batch must hold a sample");
  const std::size_t n = segs[0].weights.size();
  // The segments that hold batches, each a stratum.
  std::vector<Stratum> strata;
  std::size_t extras_size = 0;
  for (std::size_t k = 0; k < segs.size() && segs[k].step < batches; ++k) {
    const std::size_t end = k + 1 < segs.size() ? std::min(batches, segs[k + 1].step) : batches;
    strata.push_back(stratum(segs[k], end, batch));
    strata.back().at = extras_size;
    extras_size += (end - segs[k].step) * strata.back().need;
  }
  // Pass 1: the extras of each batch and each source's count at the start of each run of
  // `run` batches.
  const std::size_t run = std::max<std::size_t>(1, kTaskSamples / batch);
  const std::size_t runs = (batches + run - 1) / run;
  std::vector<std::uint32_t> extras(extras_size);
  std::vector<std::uint64_t> run_counts(runs * n);
  std::vector<std::uint64_t> count(n, 0);  // samples of each source so far
  std::vector<std::uint64_t> since(n, 0);  // ... at the start of the batch's segment
  std::vector<std::size_t> by_deficit;
  for (const Stratum& t : strata) {
    std::copy(count.begin(), count.end(), since.begin());
    for (std::size_t b = t.start; b < t.end; ++b) {
      if (b % run == 0) std::copy(count.begin(), count.end(), run_counts.begin() + (b / run) * n);
      // The extras go to the sources furthest behind their share at this batch's end (since
      // the segment's start) after their whole samples (a source with a fractional share
      // only; ties: the lower index).
      const double end = static_cast<double>(b - t.start + 1);
      auto deficit = [&](std::size_t s) {
        return t.share[s] * end - static_cast<double>(count[s] - since[s] + t.whole[s]);
      };
      by_deficit = t.fractional;
      std::stable_sort(by_deficit.begin(), by_deficit.end(),
                       [&](std::size_t x, std::size_t y) { return deficit(x) > deficit(y); });
      std::uint32_t* put = extras.data() + t.at + (b - t.start) * t.need;
      for (std::size_t k = 0; k < t.need; ++k) {
        put[k] = static_cast<std::uint32_t>(by_deficit[k]);
        ++count[by_deficit[k]];
      }
      for (std::size_t s = 0; s < n; ++s) count[s] += t.whole[s];
    }
  }
  // Pass 2: each run's batches, shuffled and numbered.
  TokenBlend out;
  out.source.resize(batch * batches);
  out.draw.resize(batch * batches);
  detail::parallel_for(runs, threads_of(threads), [&](std::size_t r) {
    std::vector<std::uint64_t> c(run_counts.begin() + r * n, run_counts.begin() + (r + 1) * n);
    std::vector<std::uint32_t> slots;
    std::vector<std::size_t> order;
    std::size_t k = 0;  // the stratum of batch b
    for (std::size_t b = r * run; b < std::min(batches, (r + 1) * run); ++b) {
      while (strata[k].end <= b) ++k;
      const Stratum& t = strata[k];
      slots.clear();
      for (std::size_t s = 0; s < n; ++s)
        slots.insert(slots.end(), t.whole[s], static_cast<std::uint32_t>(s));
      const auto from = extras.begin() + static_cast<std::ptrdiff_t>(t.at + (b - t.start) * t.need);
      slots.insert(slots.end(), from, from + static_cast<std::ptrdiff_t>(t.need));
      put_batch(slots, seed, b, c.data(), order, b * batch, out);
    }
  });
  return out;
}

}  // namespace

// Two passes. The first, in order, picks each batch's extra samples (a few per batch: they
// depend on every batch before in its segment) and notes each source's count at the start of
// each run of batches; the second shuffles and numbers the batches' samples, the runs on
// several threads, each from its noted counts. The same stream as one pass in order, on any
// number of threads.
TokenBlend stratified_blend(std::span<const TokenWeightStep> schedule, std::size_t batch,
                            std::size_t batches, std::uint64_t seed, std::size_t threads) {
  return stratified_blend_of(check_schedule(schedule, 0, true), batch, batches, seed, threads);
}

TokenBlend stratified_blend(std::span<const double> weights, std::size_t batch, std::size_t batches,
                            std::uint64_t seed, std::size_t threads) {
  return stratified_blend_of(check_schedule(plain(weights), 0, false), batch, batches, seed,
                             threads);
}

namespace {

// How many samples of each of `n` sources `source` holds.
std::vector<std::uint64_t> source_counts(std::span<const std::uint32_t> source, std::size_t n,
                                         std::size_t threads) {
  const std::size_t tasks = (source.size() + kTaskSamples - 1) / kTaskSamples;
  std::vector<std::uint64_t> per_task(tasks * n, 0);
  detail::parallel_for(tasks, threads_of(threads), [&](std::size_t t) {
    const std::size_t end = std::min(source.size(), (t + 1) * kTaskSamples);
    for (std::size_t i = t * kTaskSamples; i < end; ++i) ++per_task[t * n + source[i]];
  });
  std::vector<std::uint64_t> out(n, 0);
  for (std::size_t t = 0; t < tasks; ++t) {
    for (std::size_t s = 0; s < n; ++s) out[s] += per_task[t * n + s];
  }
  return out;
}

// A stratified mix's last, partial batch (batch `b`, the samples past the whole batches): each
// source's samples so that its segment (the schedule's last that starts at or before `b`)
// holds its share of the segment's samples as nearly as whole samples can, exactly where the
// shares are whole (a budget of rows a source), in an order shuffled as a whole batch's.
void stratified_tail(const std::vector<TokenWeightStep>& segs, std::size_t batch,
                     std::size_t samples, std::size_t b, std::uint64_t seed, std::size_t threads,
                     TokenBlend& blend) {
  const std::size_t at = blend.source.size();
  const std::size_t last = samples - at;
  if (last == 0) return;
  std::size_t k = 0;
  while (k + 1 < segs.size() && segs[k + 1].step <= b) ++k;
  const std::span<const double> weights = segs[k].weights;
  const std::size_t start = segs[k].step * batch;  // <= at: the segment's first sample
  const double sum = weight_sum(weights);
  const std::size_t n = weights.size();
  std::vector<std::uint64_t> count = source_counts(blend.source, n, threads);
  std::vector<std::uint64_t> before =
      start == 0 ? std::vector<std::uint64_t>(n, 0)
                 : source_counts(std::span(blend.source).first(start), n, threads);
  std::vector<double> behind(n);  // the samples each source is short of its share at the end
  for (std::size_t s = 0; s < n; ++s) {
    behind[s] = weights[s] / sum * static_cast<double>(samples - start) -
                static_cast<double>(count[s] - before[s]);
  }
  std::vector<std::uint32_t> slots;
  while (slots.size() < last) {  // the one furthest behind (ties: the lower index), in turn
    std::size_t pick = 0;
    for (std::size_t s = 1; s < n; ++s) {
      if (weights[s] > 0 && (weights[pick] <= 0 || behind[s] > behind[pick])) pick = s;
    }
    slots.push_back(static_cast<std::uint32_t>(pick));
    behind[pick] -= 1;
  }
  std::vector<std::size_t> order;
  blend.source.resize(samples);
  blend.draw.resize(samples);
  put_batch(slots, seed, b, count.data(), order, at, blend);
}

// iid_blend() of a checked schedule.
TokenBlend iid_blend_of(const std::vector<TokenWeightStep>& segs, std::size_t batch,
                        std::size_t samples, std::uint64_t seed, std::size_t threads) {
  if (batch == 0 && segs.size() > 1) {
    throw std::invalid_argument("stoker: a weight schedule's steps need a batch of samples");
  }
  const std::size_t n = segs[0].weights.size();
  // Per segment, its first sample and the cumulative shares; the last source with a weight
  // above 0 takes what rounding leaves (and the sources weighted 0 after it none).
  std::vector<std::size_t> starts;
  std::vector<std::vector<double>> uptos;
  for (const TokenWeightStep& seg : segs) {
    const double sum = weight_sum(seg.weights);
    std::vector<double> upto(n);
    double acc = 0;
    std::size_t last = 0;
    for (std::size_t s = 0; s < n; ++s) {
      acc += seg.weights[s] / sum;
      upto[s] = acc;
      if (seg.weights[s] > 0) last = s;
    }
    std::fill(upto.begin() + static_cast<std::ptrdiff_t>(last), upto.end(), 2.0);  // sorted
    starts.push_back(step_start(seg.step, batch, samples));
    uptos.push_back(std::move(upto));
  }
  TokenBlend out;
  out.source.resize(samples);
  out.draw.resize(samples);
  constexpr std::uint64_t kSalt = 0x6969645f626c656eULL;  // "iid_blen"
  const std::size_t tasks = (samples + kTaskSamples - 1) / kTaskSamples;
  std::vector<std::uint64_t> counts(tasks * n, 0);  // each run's samples of each source
  detail::parallel_for(tasks, threads_of(threads), [&](std::size_t t) {
    std::uint64_t* count = counts.data() + t * n;
    const std::size_t first = t * kTaskSamples;
    const std::size_t end = std::min(samples, (t + 1) * kTaskSamples);
    // The segment of sample i, and the first sample of the one after it.
    std::size_t k = static_cast<std::size_t>(std::upper_bound(starts.begin(), starts.end(), first) -
                                             starts.begin() - 1);
    std::size_t next = k + 1 < starts.size() ? starts[k + 1] : samples;
    for (std::size_t i = first; i < end; ++i) {
      while (i >= next) next = ++k + 1 < starts.size() ? starts[k + 1] : samples;
      const std::vector<double>& upto = uptos[k];
      // 53 random bits as a double in [0, 1).
      const double u = static_cast<double>(detail::mix(seed, i, kSalt) >> 11) * 0x1.0p-53;
      const auto s =
          static_cast<std::size_t>(std::upper_bound(upto.begin(), upto.end(), u) - upto.begin());
      out.source[i] = static_cast<std::uint32_t>(s);
      out.draw[i] = count[s]++;
    }
  });
  // Each run's counts become the counts before it.
  std::vector<std::uint64_t> before(n, 0);
  for (std::size_t t = 0; t < tasks; ++t) {
    for (std::size_t s = 0; s < n; ++s) {
      const std::uint64_t c = counts[t * n + s];
      counts[t * n + s] = before[s];
      before[s] += c;
    }
  }
  detail::parallel_for(tasks, threads_of(threads), [&](std::size_t t) {
    if (t == 0) return;
    const std::uint64_t* offset = counts.data() + t * n;
    const std::size_t end = std::min(samples, (t + 1) * kTaskSamples);
    for (std::size_t i = t * kTaskSamples; i < end; ++i) out.draw[i] += offset[out.source[i]];
  });
  return out;
}

}  // namespace

std::vector<TokenWeightStep> checked_schedule(std::span<const TokenWeightStep> schedule,
                                              std::size_t sources) {
  return check_schedule(schedule, sources, true);
}

// Each sample's source is its own draw; its number among its source's samples is counted in
// two passes: within runs of samples (in parallel), then each run's counts offset by the runs
// before it.
TokenBlend iid_blend(std::span<const double> weights, std::size_t samples, std::uint64_t seed,
                     std::size_t threads) {
  return iid_blend_of(check_schedule(plain(weights), 0, false), 1, samples, seed, threads);
}

TokenBlend iid_blend(std::span<const TokenWeightStep> schedule, std::size_t batch,
                     std::size_t samples, std::uint64_t seed, std::size_t threads) {
  return iid_blend_of(check_schedule(schedule, 0, true), batch, samples, seed, threads);
}

namespace {

// token_mix_index() of a checked schedule (`name_steps`: whether errors name its steps).
TokenMixIndex mix_index_of(std::span<const std::uint64_t> source_rows,
                           const std::vector<TokenWeightStep>& segs, bool name_steps,
                           TokenMixing mixing, std::size_t batch, std::size_t samples,
                           std::uint64_t seed, std::size_t threads);

}  // namespace

// The blend (stratified_blend or iid_blend, in parallel), then the permutations of every
// epoch after a source's first (each a task; together fewer entries than the samples, as each
// is started by a draw past the epochs before), then each sample's row, in parallel runs.
TokenMixIndex token_mix_index(std::span<const std::uint64_t> source_rows,
                              std::span<const double> weights, TokenMixing mixing,
                              std::size_t batch, std::size_t samples, std::uint64_t seed,
                              std::size_t threads) {
  if (weights.size() != source_rows.size()) {
    throw std::invalid_argument("stoker: " + std::to_string(weights.size()) + " weights for " +
                                std::to_string(source_rows.size()) + " sources");
  }
  return mix_index_of(source_rows, check_schedule(plain(weights), source_rows.size(), false), false,
                      mixing, batch, samples, seed, threads);
}

TokenMixIndex token_mix_index(std::span<const std::uint64_t> source_rows,
                              std::span<const TokenWeightStep> schedule, TokenMixing mixing,
                              std::size_t batch, std::size_t samples, std::uint64_t seed,
                              std::size_t threads) {
  return mix_index_of(source_rows, check_schedule(schedule, source_rows.size(), true), true, mixing,
                      batch, samples, seed, threads);
}

namespace {

TokenMixIndex mix_index_of(std::span<const std::uint64_t> source_rows,
                           const std::vector<TokenWeightStep>& segs, bool name_steps,
                           TokenMixing mixing, std::size_t batch, std::size_t samples,
                           std::uint64_t seed, std::size_t threads) {
  const std::size_t n = source_rows.size();
  for (const TokenWeightStep& seg : segs) {
    for (std::size_t s = 0; s < n; ++s) {
      if (seg.weights[s] > 0 && source_rows[s] == 0) {
        throw std::invalid_argument("stoker: source " + std::to_string(s) +
                                    " has no rows but a weight of " +
                                    std::to_string(seg.weights[s]) + segment_name(seg, name_steps));
      }
    }
  }
  TokenBlend blend;
  if (mixing == TokenMixing::stratified) {
    if (batch == 0) throw std::invalid_argument("stoker: a blend's batch must hold a sample");
    blend = stratified_blend_of(segs, batch, samples / batch, seed, threads);
    stratified_tail(segs, batch, samples, samples / batch, seed, threads, blend);
  } else {
    blend = iid_blend_of(segs, batch, samples, seed, threads);
  }
  TokenMixIndex out;
  out.source = std::move(blend.source);
  out.row = std::move(blend.draw);  // each sample's draw, made its row below
  out.epochs.assign(n, 0);
  const std::vector<std::uint64_t> draws = source_counts(out.source, n, threads);
  // The permutations of epochs 1 ... epochs - 1 of each source, end to end from first[s].
  struct Epoch {
    std::uint32_t source;
    std::uint64_t epoch;
  };
  std::vector<Epoch> epochs;
  std::vector<std::uint64_t> first(n, 0);
  std::uint64_t entries = 0;
  for (std::size_t s = 0; s < n; ++s) {
    if (draws[s] == 0) continue;
    out.epochs[s] = (draws[s] - 1) / source_rows[s] + 1;
    first[s] = entries;
    for (std::uint64_t e = 1; e < out.epochs[s]; ++e) {
      epochs.push_back({static_cast<std::uint32_t>(s), e});
      entries += source_rows[s];
    }
  }
  std::vector<std::size_t> perm(static_cast<std::size_t>(entries));
  // Tasks of whole permutations, kTaskSamples entries or more each (a source of few rows has
  // many epochs).
  std::vector<std::size_t> task_starts = {0};
  for (std::size_t k = 0, size = 0; k < epochs.size(); ++k) {
    size += static_cast<std::size_t>(source_rows[epochs[k].source]);
    if (size >= kTaskSamples || k + 1 == epochs.size()) {
      task_starts.push_back(k + 1);
      size = 0;
    }
  }
  constexpr std::uint64_t kSalt = 0x65706f6368ULL;  // "epoch"
  detail::parallel_for(task_starts.size() - 1, threads_of(threads), [&](std::size_t t) {
    std::vector<std::size_t> p;
    for (std::size_t k = task_starts[t]; k < task_starts[t + 1]; ++k) {
      const std::uint32_t s = epochs[k].source;
      const std::uint64_t e = epochs[k].epoch;
      const std::uint64_t rows = source_rows[s];
      detail::permutation(static_cast<std::size_t>(rows), detail::mix(seed, s, e ^ kSalt), p);
      std::copy(p.begin(), p.end(),
                perm.begin() + static_cast<std::ptrdiff_t>(first[s] + (e - 1) * rows));
    }
  });
  // Draw d of a source of R rows: epoch e = d / R reads row d % R, epoch 0 in the source's order.
  const std::size_t tasks = (samples + kTaskSamples - 1) / kTaskSamples;
  detail::parallel_for(tasks, threads_of(threads), [&](std::size_t t) {
    const std::size_t end = std::min(samples, (t + 1) * kTaskSamples);
    for (std::size_t i = t * kTaskSamples; i < end; ++i) {
      const std::uint32_t s = out.source[i];
      const std::uint64_t rows = source_rows[s];
      const std::uint64_t d = out.row[i];
      const std::uint64_t e = d / rows;
      const std::uint64_t k = d % rows;
      out.row[i] = e == 0 ? k : perm[static_cast<std::size_t>(first[s] + (e - 1) * rows + k)];
    }
  });
  return out;
}

}  // namespace

}  // namespace stoker
