// Language-model token data: token sources (Megatron's indexed data set, flat token files,
// columns of token lists in memory), packing of their documents into fixed-length rows as an
// index (a plan of pieces of documents, nothing copied or written), and the map-style data set
// over the packed rows.
// docs/formats.md, "Token data".
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "stoker/dataset.h"
#include "stoker/object_storage.h"

namespace stoker {

// ---- Sources ------------------------------------------------------------------------------

// The documents of one or more token files, local or in object storage: opening reads the
// indexes (Megatron) or scans the tokens for the end-of-document token (flat files), never
// copies the tokens; rows read their tokens by ranges (io::File: pread for a local file, the
// object cache for an object; docs/storage.md). Names that are s3:// or http(s):// URLs are
// objects, all of a corpus's resolved together (one listing per parent prefix); a flat s3://
// URL ending in '/' is every object directly under it. A Megatron object's .idx is read once
// (one GET); a flat object is read whole once, by the object cache's chunks, to find its
// documents.
//
// Megatron's indexed data set (megatron-core's indexed_dataset.py, `MMapIndexedDataset`):
// `PREFIX.idx` holds the magic "MMIDIDX\0\0", version 1 (u64), the dtype code (u8: 1 uint8,
// 2 int8, 3 int16, 4 int32, 5 int64, 8 uint16; the float codes 6 and 7 are refused), the
// sequence count (u64), the document-index count (u64), then the sequences' lengths (i32),
// byte offsets into PREFIX.bin (i64) and the document index (i64). Each of its sequences is a
// document here, as in megatron-core's GPTDataset.
//
// Flat token files (nanoGPT's train.bin, OLMo's .npy-less token arrays): little-endian uint16
// or uint32 tokens, split into documents after each end-of-document token (which ends, and
// belongs to, its document); tokens after a file's last end-of-document token are its last
// document. Documents never span files.
//
// Errors (std::runtime_error from the constructor, naming the file and, where one is to blame,
// the document): a missing file, a bad magic, version or dtype code, an .idx shorter than its
// header says, sequence offsets that do not follow each other, a .bin shorter than its index
// says (truncated, naming the first document past its end) or longer (the .idx does not match
// it), a flat file whose size is not a whole number of tokens, an empty document (no tokens, or
// only its end-of-document token). A token id >= vocab_size is found as rows are read:
// read_tokens() throws std::runtime_error naming the file and document.
class TokenCorpus {
 public:
  enum class FlatDType : std::uint8_t { u16, u32 };

  // Megatron data sets, by prefix (PREFIX.bin and PREFIX.idx), or by either file's path.
  // `storage`: the object cache and index cache of the URLs.
  static std::shared_ptr<const TokenCorpus> megatron(const std::vector<std::string>& prefixes,
                                                     std::uint64_t vocab_size = 0,
                                                     const ObjectStorageOptions& storage = {});
  // Flat token files split at `eod` (the end-of-document token id).
  static std::shared_ptr<const TokenCorpus> flat(const std::vector<std::string>& paths,
                                                 FlatDType dtype, std::uint64_t eod,
                                                 std::uint64_t vocab_size = 0,
                                                 const ObjectStorageOptions& storage = {});

  // Token ids in memory, laid out as Arrow's list columns hold them (a Parquet token column
  // read with pyarrow, a Hugging Face data set's `input_ids`): each row of a chunk is a
  // document, its ids values[offsets[r], offsets[r + 1]). Errors name a document
  // "SOURCE row R" (R = first_row + r): offsets that go backwards, an empty row.
  enum class IdType : std::uint8_t { u8, i8, u16, i16, u32, i32, u64, i64 };
  struct Column {
    std::string source;  // e.g. "train.parquet column input_ids"
    std::uint64_t first_row = 0;
    IdType type = IdType::i64;
    const void* values = nullptr;
    std::span<const std::int64_t> offsets;  // rows + 1 entries, read at construction only
  };
  // The columns' memory is not copied: `owner` keeps it alive as long as the corpus.
  static std::shared_ptr<const TokenCorpus> columns(std::vector<Column> columns,
                                                    std::shared_ptr<const void> owner,
                                                    std::uint64_t vocab_size = 0);

  ~TokenCorpus();
  TokenCorpus(const TokenCorpus&) = delete;
  TokenCorpus& operator=(const TokenCorpus&) = delete;

  std::size_t documents() const;
  std::uint64_t tokens() const;
  // Every document's length in tokens, in corpus order (files in the order given).
  std::span<const std::uint32_t> lengths() const;
  std::uint64_t vocab_size() const;  // 0: not checked

  // Tokens [offset, offset + out.size()) of document `doc`, as int64; with `next`, the token
  // after them too (read with them), into *next, which is left as it is when they end the
  // document. Throws std::out_of_range past the document, std::runtime_error for a token >=
  // vocab_size. Any thread.
  void read_tokens(std::size_t doc, std::uint64_t offset, std::span<std::int64_t> out,
                   std::int64_t* next = nullptr) const;

  // "FILE document D" (D counted within the file; "SOURCE row R" for columns), as errors
  // name it.
  std::string document_name(std::size_t doc) const;
  std::size_t files() const;
  const std::string& file(std::size_t index) const;
  // The traffic of the object cache the corpus's objects are read through; zero for local files
  // and columns.
  ObjectStorageCounters object_storage_counters() const;

  struct Impl;

 private:
  explicit TokenCorpus(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// ---- Packing plan -------------------------------------------------------------------------

struct TokenPackOptions {
  enum class Mode : std::uint8_t {
    // GPT style: the documents (in the planned order) as one stream of tokens cut into rows of
    // seq_len; the stream's last partial row is dropped. No padding.
    concat,
    // Whole documents into rows, each document into the open row with the least room that
    // holds it (a new row when none does); rows end padded.
    best_fit,
  };
  enum class Long : std::uint8_t {
    split,     // best_fit: a document longer than seq_len is cut into seq_len pieces
    truncate,  // best_fit: only its first seq_len tokens are used
  };
  Mode mode = Mode::concat;
  std::size_t seq_len = 2048;
  Long long_documents = Long::split;
  // The documents are taken in an order shuffled with `seed` (Fisher-Yates over SplitMix64,
  // the same on every platform) unless shuffle_documents is false (corpus order).
  bool shuffle_documents = true;
  std::uint64_t seed = 0;
};

// One piece of a row: `length` tokens of document `doc` from token `offset`.
struct TokenPiece {
  std::uint64_t doc = 0;
  std::uint32_t offset = 0;
  std::uint32_t length = 0;
  friend bool operator==(const TokenPiece&, const TokenPiece&) = default;
};

// The rows as an index into the documents: row r is pieces[row_starts[r], row_starts[r + 1]),
// laid end to end from the row's first token, then padding up to seq_len.
struct TokenPlan {
  std::size_t seq_len = 0;
  std::vector<TokenPiece> pieces;
  std::vector<std::uint64_t> row_starts;  // rows() + 1 entries
  std::size_t max_pieces = 0;             // the most pieces in one row
  std::uint64_t tokens = 0;               // tokens in rows (not padding)

  std::size_t rows() const { return row_starts.empty() ? 0 : row_starts.size() - 1; }
  std::span<const TokenPiece> row(std::size_t r) const {
    return std::span(pieces).subspan(row_starts[r], row_starts[r + 1] - row_starts[r]);
  }
  // Tokens that are not padding, over all the rows' slots.
  double fill() const;
};

// The plan: a pure function of (lengths, options), O(documents + rows) (best_fit: times a scan
// of seq_len / 64 words of a bitmap of free room per document). Throws std::invalid_argument
// for seq_len 0 or > 2^31, or a document of length 0.
TokenPlan plan_rows(std::span<const std::uint32_t> lengths, const TokenPackOptions& options);

// ---- Mixing -------------------------------------------------------------------------------

// A weight schedule: the weights (one per source, >= 0, not all 0) from global batch `step`
// on, until the next segment's step. A schedule's first segment is at step 0 and its steps
// increase; a segment whose weights equal the one before it is no change (it is dropped, so
// it splits nothing). A step is a global batch: `batch` samples (for iid mixing too; with a
// batch of 1 a step is a sample).
struct TokenWeightStep {
  std::size_t step = 0;
  std::vector<double> weights;
  friend bool operator==(const TokenWeightStep&, const TokenWeightStep&) = default;
};
// The schedule checked and with its no-change segments dropped. Throws std::invalid_argument,
// naming the segment by its step, for no segments, a first segment not at step 0, steps that
// do not increase, a segment whose weights are not `sources` in number (sources 0: the first
// segment's number), a negative or non-finite weight, or all of a segment's weights 0.
std::vector<TokenWeightStep> checked_schedule(std::span<const TokenWeightStep> schedule,
                                              std::size_t sources = 0);

// A mixed stream of samples from several sources by weight, `stratified`: every global batch of
// `batch` samples holds floor(w_s * batch) or that plus one samples of source s (w_s its weight
// over their sum), the sources that get the one more chosen by how far each is behind its
// share so far, so that over the stream each source's count stays within one sample of its
// share at every batch's end. Within a batch the samples are in an order shuffled by the seed
// and the batch's number. A pure function of (weights, batch, batches, seed): the same on any
// number of `threads` (0: the machine's), which build it in parallel.
//
// With a schedule, each batch holds its own segment's shares so (floor or floor + 1 of
// w_s * batch, w the weights of the batch's step), and each segment is mixed as a stream of
// its own from its first batch: "behind its share so far" counts the samples since the
// segment's first batch against the segment's shares, so within a segment each source's count
// since its start stays within one sample of its share of the segment's batches so far (over
// the whole stream: within one sample per segment begun). The draws go on counting each
// source's samples from the stream's start, across segments. The batches before a segment's
// step depend on no later segment (the schedule's prefix gives the stream's prefix), so a run
// whose later schedule changes continues from the samples already drawn.
struct TokenBlend {
  std::vector<std::uint32_t> source;  // each sample's source
  std::vector<std::uint64_t> draw;    // each sample's number among its source's samples so far
};
// Throws std::invalid_argument for no sources, a negative or non-finite weight, all weights 0,
// or batch 0; a bad schedule as checked_schedule does.
TokenBlend stratified_blend(std::span<const double> weights, std::size_t batch, std::size_t batches,
                            std::uint64_t seed, std::size_t threads = 0);
TokenBlend stratified_blend(std::span<const TokenWeightStep> schedule, std::size_t batch,
                            std::size_t batches, std::uint64_t seed, std::size_t threads = 0);

// The same stream drawn i.i.d.: sample i's source is drawn by weight from a generator seeded by
// (seed, i), so the counts of a source follow the binomial spread around its share. A pure
// function of (weights, samples, seed), built on `threads` as stratified_blend is. Throws as
// stratified_blend does. With a schedule, sample i draws by the weights of its step,
// i / batch (the same draw of the same generator: only the weights change).
TokenBlend iid_blend(std::span<const double> weights, std::size_t samples, std::uint64_t seed,
                     std::size_t threads = 0);
TokenBlend iid_blend(std::span<const TokenWeightStep> schedule, std::size_t batch,
                     std::size_t samples, std::uint64_t seed, std::size_t threads = 0);

enum class TokenMixing : std::uint8_t { stratified, iid };

// Which row of which source each sample of a mix reads: the blend (stratified over global
// batches of `batch` samples, or i.i.d.) of `samples` samples, each source's draws mapped to
// its rows. Per-source epochs: draw d of a source of R rows is in its epoch e = d / R, at
// position k = d % R; epoch 0 reads row k (the source's own order: its plan, shuffled by its
// seed), each later epoch a permutation of its R rows seeded by (seed, source, e). A source
// that runs out of rows thus wraps around to a new epoch, and the mix keeps its weights.
// A pure function of its arguments, O(samples + the rows of the epochs started), built on
// `threads` (0: the machine's) with the same result on any number.
struct TokenMixIndex {
  std::vector<std::uint32_t> source;  // each sample's source
  std::vector<std::uint64_t> row;     // each sample's row in its source
  std::vector<std::uint64_t> epochs;  // per source: the epochs the mix starts (0: none read)
};
// With a schedule, the blend follows it (stratified_blend's and iid_blend's schedules); the
// rows of a source's draws do not depend on the weights, so the index's samples before a
// segment's step are the same whatever the segments from it on say.
// Throws std::invalid_argument as the blends do, for a weight per source missing, or a source
// of no rows with a weight above 0 (in any segment).
TokenMixIndex token_mix_index(std::span<const std::uint64_t> source_rows,
                              std::span<const double> weights, TokenMixing mixing,
                              std::size_t batch, std::size_t samples, std::uint64_t seed,
                              std::size_t threads = 0);
TokenMixIndex token_mix_index(std::span<const std::uint64_t> source_rows,
                              std::span<const TokenWeightStep> schedule, TokenMixing mixing,
                              std::size_t batch, std::size_t samples, std::uint64_t seed,
                              std::size_t threads = 0);

// ---- The data set -------------------------------------------------------------------------

struct TokenRowsOptions {
  TokenPackOptions pack;
  enum class Labels : std::uint8_t {
    // labels[i] is the token that follows input_ids[i] in its document (read past the row's
    // end as Megatron's seq_len + 1 tokens are), -100 where input_ids[i] is its document's
    // last token, and at padding: a plain cross-entropy over (logits, labels).
    next,
    // labels = input_ids, -100 at each segment's first token and at padding: for models that
    // shift labels themselves (Hugging Face's), never predicting across a boundary.
    same,
  };
  Labels labels = Labels::next;
  std::int64_t pad_id = 0;  // input_ids at padding
  // cu_seqlens' entries past a row's segments (see TokenRows); 0: the plan's max_pieces + 1
  // (a segment per piece, and one for the padding). Fewer than a row needs: invalid_argument.
  std::size_t max_segments = 0;
};

inline constexpr std::int64_t kIgnoreLabel = -100;  // torch's cross_entropy ignore_index

// Packed rows of a TokenCorpus. Fields (one row each):
//   input_ids    i64 [seq_len]  the tokens; pad_id at padding
//   labels       i64 [seq_len]  per TokenRowsOptions::Labels; -100 at padding
//   position_ids i64 [seq_len]  0, 1, ... from each segment's first token; 0 at padding
//   document_ids i64 [seq_len]  the corpus document of each token; -1 at padding
//   cu_seqlens   i32 [max_segments + 1]  0, then the end of each segment (a piece of a
//                document; the padding, when the row has some, is one more segment), then
//                seq_len repeated: the fill is empty segments, so every entry is a valid
//                varlen boundary and cu_seqlens[-1] == seq_len.
// A model's attention must keep each token to its own segment (FlashAttention's varlen
// kernels with these cu_seqlens, or a block-diagonal mask from document_ids).
//
// Thread safety: read() from any thread.
class TokenRows final : public Dataset {
 public:
  TokenRows(std::shared_ptr<const TokenCorpus> corpus, TokenRowsOptions options);

  std::size_t size() const override;
  std::vector<FieldSpec> fields() const override;
  void read(std::size_t index, const SampleOut& out) const override;
  std::string sample_name(std::size_t index) const override;
  ObjectStorageCounters object_storage_counters() const override {
    return corpus_->object_storage_counters();
  }

  const TokenPlan& plan() const { return plan_; }
  const TokenRowsOptions& options() const { return options_; }
  const TokenCorpus& corpus() const { return *corpus_; }
  std::size_t max_segments() const { return max_segments_; }

 private:
  std::shared_ptr<const TokenCorpus> corpus_;
  TokenRowsOptions options_;
  TokenPlan plan_;
  std::size_t max_segments_ = 0;
};

struct TokenMixOptions {
  std::vector<double> weights;  // one per source, >= 0, not all 0 (empty with a schedule)
  // Weights that change at given steps (global batches of `batch` samples), instead of
  // `weights` (give one of them): see TokenWeightStep and stratified_blend. The samples before
  // a segment's step do not depend on it or any later segment, so a run resumed with a
  // schedule whose later segments changed continues from the rows already read.
  std::vector<TokenWeightStep> schedule;
  TokenMixing mixing = TokenMixing::stratified;
  // The global batch (samples per step over all ranks) that stratified mixing keeps each
  // source's share in, within one sample; read the mix in order (no shuffling sampler) so that
  // each step's global batch is one of these.
  std::size_t batch = 1;
  std::size_t samples = 0;  // the mix's size; 0: the sum of the sources' rows
  std::uint64_t seed = 0;
  // The index cache (docs/formats.md, "Token data": the mix's index cache): a mix of
  // kTokenMixCacheSamples samples or more keeps its index there (index_cache.h's entries, kind
  // "STKMIX01", DIR/<XXH3-64 of its key>.mix), keyed by everything the index is made from (the
  // sources' files, their sizes and mtimes, documents, tokens, packing and rows; the weights,
  // mixing, batch, samples and seed; a schedule's segments), so that the next mix of the same
  // inputs (another rank or worker, a later run) loads it instead of building it; any input changed
  // builds it again, and so does an entry damaged or cut short (named in a warning).
  // `index_cache_dir`: "" is the index caches' default place ($STOKER_CACHE_DIR/indexes, ...:
  // ObjectStorageOptions); `index_cache` false: none.
  std::string index_cache_dir;
  bool index_cache = true;
};

// The smallest mix whose index is kept in the index cache (smaller ones build faster than a
// file is read).
inline constexpr std::size_t kTokenMixCacheSamples = std::size_t{1} << 16;

// Several TokenRows mixed by weight (token_mix_index): sample i is row index().row[i] of source
// index().source[i]. Fields: the sources' (which must be the same: seq_len and max_segments)
// and `source` (i64 scalar), the source the row came from.
//
// Thread safety: read() from any thread.
class TokenMix final : public Dataset {
 public:
  TokenMix(std::vector<std::shared_ptr<const TokenRows>> sources, TokenMixOptions options);

  std::size_t size() const override;
  std::vector<FieldSpec> fields() const override;
  void read(std::size_t index, const SampleOut& out) const override;
  std::string sample_name(std::size_t index) const override;

  const TokenMixIndex& index() const { return index_; }
  // Whether the index was loaded from the index cache (false: built here).
  bool index_from_cache() const { return index_from_cache_; }
  const TokenRows& source(std::size_t s) const { return *sources_.at(s); }
  std::size_t sources() const { return sources_.size(); }

 private:
  std::vector<std::shared_ptr<const TokenRows>> sources_;
  TokenMixIndex index_;
  bool index_from_cache_ = false;
  std::vector<FieldSpec> fields_;
};

}  // namespace stoker
