#include "token_dataset.h"

#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "gil.h"
#include "native_datasets.h"
#include "stoker/tokens.h"

namespace stoker::python {
namespace {

const TokenRows& rows_of(const NativeDataset& d) {
  const auto* r = dynamic_cast<const TokenRows*>(d.dataset.get());
  if (r == nullptr) throw py::type_error("stoker: not a TokenDataset");
  return *r;
}

TokenPackOptions pack_options(const std::string& pack, std::size_t seq_len,
                              const std::string& long_documents, bool shuffle_documents,
                              std::uint64_t seed) {
  TokenPackOptions o;
  if (pack == "concat") {
    o.mode = TokenPackOptions::Mode::concat;
  } else if (pack == "best_fit") {
    o.mode = TokenPackOptions::Mode::best_fit;
  } else {
    throw py::value_error("stoker.TokenDataset: pack must be 'concat' or 'best_fit', not '" + pack +
                          "'");
  }
  if (long_documents == "split") {
    o.long_documents = TokenPackOptions::Long::split;
  } else if (long_documents == "truncate") {
    o.long_documents = TokenPackOptions::Long::truncate;
  } else {
    throw py::value_error(
        "stoker.TokenDataset: long_documents must be 'split' or 'truncate', not '" +
        long_documents + "'");
  }
  o.seq_len = seq_len;
  o.shuffle_documents = shuffle_documents;
  o.seed = seed;
  return o;
}

TokenRowsOptions rows_options(const std::string& pack, std::size_t seq_len,
                              const std::string& long_documents, bool shuffle_documents,
                              std::uint64_t seed, const std::string& labels, std::int64_t pad_id,
                              std::size_t max_segments) {
  TokenRowsOptions o;
  o.pack = pack_options(pack, seq_len, long_documents, shuffle_documents, seed);
  if (labels == "next") {
    o.labels = TokenRowsOptions::Labels::next;
  } else if (labels == "same") {
    o.labels = TokenRowsOptions::Labels::same;
  } else {
    throw py::value_error("stoker.TokenDataset: labels must be 'next' or 'same', not '" + labels +
                          "'");
  }
  o.pad_id = pad_id;
  o.max_segments = max_segments;
  return o;
}

NativeDataset make_token_rows(const std::string& format, const std::vector<std::string>& paths,
                              const std::string& dtype, std::int64_t eod, std::uint64_t vocab_size,
                              const std::string& pack, std::size_t seq_len,
                              const std::string& long_documents, bool shuffle_documents,
                              std::uint64_t seed, const std::string& labels, std::int64_t pad_id,
                              std::size_t max_segments, const std::string& index_cache_dir,
                              bool index_cache, const std::string& object_cache_dir,
                              std::uint64_t object_cache_bytes) {
  const ObjectStorageOptions storage =
      object_storage_options(index_cache_dir, index_cache, object_cache_dir, object_cache_bytes);
  const TokenRowsOptions o = rows_options(pack, seq_len, long_documents, shuffle_documents, seed,
                                          labels, pad_id, max_segments);
  TokenCorpus::FlatDType flat_dtype = TokenCorpus::FlatDType::u16;
  if (format == "flat") {
    if (dtype == "uint32") {
      flat_dtype = TokenCorpus::FlatDType::u32;
    } else if (dtype != "uint16") {
      throw py::value_error("stoker.TokenDataset: dtype must be 'uint16' or 'uint32', not '" +
                            dtype + "'");
    }
    if (eod < 0) throw py::value_error("stoker.TokenDataset: flat token files need eod");
  } else if (format != "megatron") {
    throw py::value_error("stoker.TokenDataset: format must be 'megatron' or 'flat', not '" +
                          format + "'");
  }
  NativeDataset out;
  {
    py::gil_scoped_release nogil;  // listing, scanning flat files and planning take a while
    auto corpus = format == "flat"
                      ? TokenCorpus::flat(paths, flat_dtype, static_cast<std::uint64_t>(eod),
                                          vocab_size, storage)
                      : TokenCorpus::megatron(paths, vocab_size, storage);
    out.dataset = std::make_shared<TokenRows>(std::move(corpus), o);
  }
  out.element_types = {"int64", "int64", "int64", "int64", "int32"};
  return out;
}

TokenCorpus::IdType id_type(const py::array& values, const std::string& source) {
  const auto dt = values.dtype();
  const char kind = dt.kind();
  const auto size = dt.itemsize();
  if (kind == 'i' || kind == 'u') {
    const bool u = kind == 'u';
    switch (size) {
      case 1:
        return u ? TokenCorpus::IdType::u8 : TokenCorpus::IdType::i8;
      case 2:
        return u ? TokenCorpus::IdType::u16 : TokenCorpus::IdType::i16;
      case 4:
        return u ? TokenCorpus::IdType::u32 : TokenCorpus::IdType::i32;
      case 8:
        return u ? TokenCorpus::IdType::u64 : TokenCorpus::IdType::i64;
      default:
        break;
    }
  }
  throw py::type_error("stoker.TokenDataset: " + source + " holds " +
                       py::str(dt).cast<std::string>() + ", not integer token ids");
}

// Columns of token lists in memory (pyarrow's buffers as numpy arrays: values and int64
// offsets per chunk), kept alive by `owner`, a Python object let go with the GIL.
NativeDataset make_token_rows_columns(const py::list& columns, const py::object& owner,
                                      std::uint64_t vocab_size, const std::string& pack,
                                      std::size_t seq_len, const std::string& long_documents,
                                      bool shuffle_documents, std::uint64_t seed,
                                      const std::string& labels, std::int64_t pad_id,
                                      std::size_t max_segments) {
  const TokenRowsOptions o = rows_options(pack, seq_len, long_documents, shuffle_documents, seed,
                                          labels, pad_id, max_segments);
  std::vector<TokenCorpus::Column> cols;
  std::vector<py::array_t<std::int64_t, py::array::c_style | py::array::forcecast>> offsets;
  py::list arrays;  // every array the corpus points into
  for (auto item : columns) {
    const auto t = item.cast<py::tuple>();
    TokenCorpus::Column c;
    c.source = t[0].cast<std::string>();
    c.first_row = t[1].cast<std::uint64_t>();
    const auto values = py::array::ensure(t[2], py::array::c_style);
    if (!values) throw py::type_error("stoker.TokenDataset: " + c.source + ": values not an array");
    c.type = id_type(values, c.source);
    c.values = values.data();
    offsets.emplace_back(t[3]);
    c.offsets = std::span<const std::int64_t>(offsets.back().data(),
                                              static_cast<std::size_t>(offsets.back().size()));
    arrays.append(values);
    cols.push_back(std::move(c));
  }
  arrays.append(owner);
  std::shared_ptr<const void> keep = hold(std::move(arrays));
  NativeDataset out;
  {
    py::gil_scoped_release nogil;
    auto corpus = TokenCorpus::columns(std::move(cols), std::move(keep), vocab_size);
    out.dataset = std::make_shared<TokenRows>(std::move(corpus), o);
  }
  out.element_types = {"int64", "int64", "int64", "int64", "int32"};
  return out;
}

template <class T>
py::array_t<T> to_numpy(const std::vector<T>& v) {
  py::array_t<T> a(static_cast<py::ssize_t>(v.size()));
  if (!v.empty()) std::memcpy(a.mutable_data(), v.data(), v.size() * sizeof(T));
  return a;
}

// A weight schedule from Python's [(step, weights), ...] (stoker.TokenMix's, normalized there).
using PySchedule = std::vector<std::pair<std::size_t, std::vector<double>>>;
std::vector<TokenWeightStep> schedule_of(const PySchedule& schedule) {
  std::vector<TokenWeightStep> out;
  for (const auto& [step, weights] : schedule) out.push_back({step, weights});
  return out;
}

TokenMixing mixing_of(const std::string& mixing) {
  if (mixing == "stratified") return TokenMixing::stratified;
  if (mixing == "iid") return TokenMixing::iid;
  throw py::value_error("stoker.TokenMix: mixing must be 'stratified' or 'iid', not '" + mixing +
                        "'");
}

// A plan as numpy arrays: (doc, offset, length) per piece and the rows' starts.
py::dict plan_dict(const TokenPlan& plan) {
  std::vector<std::uint64_t> doc(plan.pieces.size());
  std::vector<std::uint32_t> offset(plan.pieces.size()), length(plan.pieces.size());
  for (std::size_t i = 0; i < plan.pieces.size(); ++i) {
    doc[i] = plan.pieces[i].doc;
    offset[i] = plan.pieces[i].offset;
    length[i] = plan.pieces[i].length;
  }
  py::dict d;
  d["doc"] = to_numpy(doc);
  d["offset"] = to_numpy(offset);
  d["length"] = to_numpy(length);
  d["row_starts"] = to_numpy(plan.row_starts);
  d["seq_len"] = plan.seq_len;
  d["max_pieces"] = plan.max_pieces;
  d["tokens"] = plan.tokens;
  d["fill"] = plan.fill();
  return d;
}

}  // namespace

void bind_tokens(py::module_& m) {
  m.def("token_rows", &make_token_rows, py::arg("format"), py::arg("paths"), py::arg("dtype"),
        py::arg("eod"), py::arg("vocab_size"), py::arg("pack"), py::arg("seq_len"),
        py::arg("long_documents"), py::arg("shuffle_documents"), py::arg("seed"), py::arg("labels"),
        py::arg("pad_id"), py::arg("max_segments"), py::arg("index_cache_dir") = "",
        py::arg("index_cache") = true, py::arg("object_cache_dir") = "",
        py::arg("object_cache_bytes") = std::uint64_t{10} << 30);
  m.def("token_rows_columns", &make_token_rows_columns, py::arg("columns"), py::arg("owner"),
        py::arg("vocab_size"), py::arg("pack"), py::arg("seq_len"), py::arg("long_documents"),
        py::arg("shuffle_documents"), py::arg("seed"), py::arg("labels"), py::arg("pad_id"),
        py::arg("max_segments"));
  m.def(
      "token_plan",
      [](const py::array_t<std::uint32_t, py::array::c_style | py::array::forcecast>& lengths,
         const std::string& pack, std::size_t seq_len, const std::string& long_documents,
         bool shuffle_documents, std::uint64_t seed) {
        const auto o = pack_options(pack, seq_len, long_documents, shuffle_documents, seed);
        const std::span<const std::uint32_t> span(lengths.data(),
                                                  static_cast<std::size_t>(lengths.size()));
        TokenPlan plan;
        {
          py::gil_scoped_release nogil;
          plan = plan_rows(span, o);
        }
        return plan_dict(plan);
      },
      py::arg("lengths"), py::arg("pack"), py::arg("seq_len"), py::arg("long_documents"),
      py::arg("shuffle_documents"), py::arg("seed"));
  m.def("token_rows_plan", [](const NativeDataset& d) { return plan_dict(rows_of(d).plan()); });
  m.def("token_lengths", [](const NativeDataset& d) {
    const auto l = rows_of(d).corpus().lengths();
    return to_numpy(std::vector<std::uint32_t>(l.begin(), l.end()));
  });
  m.def("token_files", [](const NativeDataset& d) {
    const auto& c = rows_of(d).corpus();
    std::vector<std::string> out;
    for (std::size_t i = 0; i < c.files(); ++i) out.push_back(c.file(i));
    return out;
  });
  m.def("token_document_name", [](const NativeDataset& d, std::size_t doc) {
    return rows_of(d).corpus().document_name(doc);
  });
  m.def(
      "stratified_blend",
      [](const PySchedule& schedule, std::size_t batch, std::size_t batches, std::uint64_t seed) {
        const auto steps = schedule_of(schedule);
        TokenBlend blend;
        {
          py::gil_scoped_release nogil;
          blend = steps.size() == 1 && steps[0].step == 0
                      ? stratified_blend(steps[0].weights, batch, batches, seed)
                      : stratified_blend(steps, batch, batches, seed);
        }
        return py::make_tuple(to_numpy(blend.source), to_numpy(blend.draw));
      },
      py::arg("schedule"), py::arg("batch"), py::arg("batches"), py::arg("seed"));
  m.def(
      "iid_blend",
      [](const std::vector<double>& weights, std::size_t samples, std::uint64_t seed) {
        TokenBlend blend;
        {
          py::gil_scoped_release nogil;
          blend = iid_blend(weights, samples, seed);
        }
        return py::make_tuple(to_numpy(blend.source), to_numpy(blend.draw));
      },
      py::arg("weights"), py::arg("samples"), py::arg("seed"));
  m.def(
      "token_mix_index",
      [](const std::vector<std::uint64_t>& source_rows, const PySchedule& schedule,
         const std::string& mixing, std::size_t batch, std::size_t samples, std::uint64_t seed,
         std::size_t threads) {
        const auto kind = mixing_of(mixing);
        const auto steps = schedule_of(schedule);
        TokenMixIndex index;
        {
          py::gil_scoped_release nogil;
          index = steps.size() == 1 && steps[0].step == 0
                      ? token_mix_index(source_rows, steps[0].weights, kind, batch, samples, seed,
                                        threads)
                      : token_mix_index(source_rows, steps, kind, batch, samples, seed, threads);
        }
        return py::make_tuple(to_numpy(index.source), to_numpy(index.row), to_numpy(index.epochs));
      },
      py::arg("source_rows"), py::arg("schedule"), py::arg("mixing"), py::arg("batch"),
      py::arg("samples"), py::arg("seed"), py::arg("threads") = 0);
  m.def(
      "token_mix",
      [](const std::vector<NativeDataset>& sources, const PySchedule& schedule,
         const std::string& mixing, std::size_t batch, std::size_t samples, std::uint64_t seed,
         const std::string& index_cache_dir, bool index_cache) {
        std::vector<std::shared_ptr<const TokenRows>> rows;
        for (const auto& d : sources) {
          auto r = std::dynamic_pointer_cast<const TokenRows>(d.dataset);
          if (!r) throw py::type_error("stoker.TokenMix: a source is not a stoker.TokenDataset");
          rows.push_back(std::move(r));
        }
        TokenMixOptions o;
        auto steps = schedule_of(schedule);
        if (steps.size() == 1 && steps[0].step == 0) {
          o.weights = std::move(steps[0].weights);
        } else {
          o.schedule = std::move(steps);
        }
        o.mixing = mixing_of(mixing);
        o.batch = batch;
        o.samples = samples;
        o.seed = seed;
        o.index_cache_dir = index_cache_dir;
        o.index_cache = index_cache;
        NativeDataset out;
        {
          py::gil_scoped_release nogil;
          out.dataset = std::make_shared<TokenMix>(std::move(rows), std::move(o));
        }
        out.element_types = {"int64", "int64", "int64", "int64", "int32", "int64"};
        return out;
      },
      py::arg("sources"), py::arg("schedule"), py::arg("mixing"), py::arg("batch"),
      py::arg("samples"), py::arg("seed"), py::arg("index_cache_dir") = "",
      py::arg("index_cache") = true);
  m.def("token_mix_from_cache", [](const NativeDataset& d) {
    const auto* mix = dynamic_cast<const TokenMix*>(d.dataset.get());
    if (mix == nullptr) throw py::type_error("stoker: not a TokenMix");
    return mix->index_from_cache();
  });
  m.def("token_mix_epochs", [](const NativeDataset& d) {
    const auto* mix = dynamic_cast<const TokenMix*>(d.dataset.get());
    if (mix == nullptr) throw py::type_error("stoker: not a TokenMix");
    return to_numpy(mix->index().epochs);
  });
  m.def("token_max_segments", [](const NativeDataset& d) { return rows_of(d).max_segments(); });
}

}  // namespace stoker::python
