// zoi._cpu.WordPiece / ByteBPE / SentencePiece: the native tokenizers' Python bindings. A batch is read under the GIL
// (each str's UTF-8, cached by Python), tokenised with the GIL released (big batches spread
// over the core's pool, texts claimed in small blocks) and handed back packed: ids,
// positions and cu_seqlens as int32 numpy arrays that own their buffers (no copy).
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <atomic>
#include <climits>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "runtime/pool.h"
#include "tokenizer/bpe.h"
#include "tokenizer/encoder.h"
#include "tokenizer/sentencepiece.h"
#include "tokenizer/wordpiece.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace {

using Out = nb::ndarray<nb::numpy, int32_t, nb::ndim<1>>;
using Buf = nb::ndarray<int32_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using zoi::tok::TextEncoder;

Out own(std::vector<int32_t>* v) {
  nb::capsule owner(v, [](void* p) noexcept { delete static_cast<std::vector<int32_t>*>(p); });
  return Out(v->data(), {v->size()}, owner);
}

// smaller batches run on the calling thread: 16 KB (~30 texts of 128 tokens) on a pool of 2
// threads, where waking the other thread pays only for big batches; 4 KB (~8 such texts,
// ~35 us on one thread) on bigger pools, which split a batch into small claims
constexpr size_t kParallelBytes = 16384;
constexpr size_t kParallelBytesWide = 4096;
constexpr int kBlock = 8;                 // texts claimed at a time by a pool thread (at most)

// The UTF-8 of every text of a Python sequence of str, read under the GIL; `tup` holds the
// texts (and so their cached UTF-8) alive while the GIL is released.
struct Texts {
  nb::object tup;
  std::vector<const char*> s;
  std::vector<size_t> n;
  size_t total = 0;
  int size() const { return static_cast<int>(s.size()); }
};

[[noreturn]] void bad_unicode(PyObject* t, Py_ssize_t i) {
  PyErr_Clear();
  const Py_ssize_t len = PyUnicode_GetLength(t);
  for (Py_ssize_t k = 0; k < len; ++k) {
    const Py_UCS4 c = PyUnicode_ReadChar(t, k);
    if (c >= 0xD800 && c <= 0xDFFF) {
      char msg[256];
      std::snprintf(msg, sizeof msg,
                    "texts[%lld] is not valid Unicode text (a lone surrogate U+%04X at character %lld); "
                    "decode it with errors='replace' or fix its source",
                    static_cast<long long>(i), static_cast<unsigned>(c), static_cast<long long>(k));
      throw nb::value_error(msg);
    }
  }
  throw nb::value_error(("texts[" + std::to_string(i) + "] cannot be read as UTF-8").c_str());
}

void read_texts(nb::handle texts, Texts& t) {
  if (PyUnicode_Check(texts.ptr()) || PyBytes_Check(texts.ptr()))
    throw nb::type_error("expected a list of str, got a single str");
  t.tup = nb::steal(PySequence_Tuple(texts.ptr()));
  if (!t.tup.is_valid()) {
    PyErr_Clear();
    throw nb::type_error(("texts should be a str or a list of str, got " +
                          std::string(Py_TYPE(texts.ptr())->tp_name)).c_str());
  }
  const Py_ssize_t B = PyTuple_GET_SIZE(t.tup.ptr());
  if (B > INT_MAX / 2) throw nb::value_error("too many texts in one call");
  t.s.resize(B);
  t.n.resize(B);
  for (Py_ssize_t i = 0; i < B; ++i) {
    PyObject* x = PyTuple_GET_ITEM(t.tup.ptr(), i);
    if (!PyUnicode_Check(x))
      throw nb::type_error(("texts[" + std::to_string(i) + "] is " + Py_TYPE(x)->tp_name + ", expected str").c_str());
    Py_ssize_t len;
    const char* p = PyUnicode_AsUTF8AndSize(x, &len);
    if (!p) bad_unicode(x, i);
    t.s[i] = p;
    t.n[i] = static_cast<size_t>(len);
    t.total += t.n[i];
  }
}

struct Batch {
  const TextEncoder* tok;
  const char* const* s;
  const size_t* n;
  int B;
  bool truncate;
  int max_len;
  int per;  // texts per claim
  int nblocks;
  std::vector<std::vector<int32_t>>* blocks;
  int32_t* lens;
  std::atomic<int> next{0};
  std::atomic<int> bad{INT_MAX};

  void block(int b, std::vector<int32_t>& out) {
    for (int i = b * per, e = std::min(B, (b + 1) * per); i < e; ++i) {
      const size_t mark = out.size();
      if (!tok->encode(s[i], n[i], truncate, out, max_len)) {
        out.resize(mark);
        int cur = bad.load();
        while (i < cur && !bad.compare_exchange_weak(cur, i)) {
        }
      }
      lens[i] = static_cast<int32_t>(out.size() - mark);
    }
  }
  static void job(void* ctx, int, int) {
    Batch& j = *static_cast<Batch*>(ctx);
    for (int b; (b = j.next.fetch_add(1, std::memory_order_relaxed)) < j.nblocks;) j.block(b, (*j.blocks)[b]);
  }
};

// Texts [0, B) of s / n tokenised in order, their ids appended to `ids` and their lengths
// written to lens[0..B). nthreads 0: the pool when the batch holds kParallelBytes or more.
// Returns the index of the first text over the limit (truncate=false; its ids left out), or
// -1. Call without the GIL. The ids do not depend on the thread count.
int tokenize_run(const TextEncoder& tok, const char* const* s, const size_t* n, int B, size_t bytes, bool truncate,
                 int max_len, int nthreads, std::vector<int32_t>& ids, int32_t* lens) {
  int nt = nthreads;
  if (nt <= 0) {
    const int pool = zoi::ThreadPool::instance().size();
    nt = bytes >= (pool > 2 ? kParallelBytesWide : kParallelBytes) ? pool : 1;
  }
  // claims of up to kBlock texts, at least 4 per thread so a slow thread is caught up
  if (nt > B) nt = B;
  const int block = std::max(1, std::min(kBlock, B / std::max(1, 4 * nt)));
  const int nblocks = (B + block - 1) / block;
  int bad = -1;
  if (nt <= 1) {
    ids.reserve(ids.size() + bytes / 3 + 4 * B + 16);
    for (int i = 0; i < B; ++i) {
      const size_t mark = ids.size();
      if (!tok.encode(s[i], n[i], truncate, ids, max_len)) {
        ids.resize(mark);
        if (bad < 0) bad = i;
      }
      lens[i] = static_cast<int32_t>(ids.size() - mark);
    }
    return bad;
  }
  std::vector<std::vector<int32_t>> blocks(nblocks);
  Batch j{&tok, s, n, B, truncate, max_len, block, nblocks, &blocks, lens};
  zoi::ThreadPool::instance().run(&Batch::job, &j, nt);
  size_t T = ids.size();
  for (auto& b : blocks) T += b.size();
  ids.reserve(T);
  for (auto& b : blocks) ids.insert(ids.end(), b.begin(), b.end());
  return j.bad.load() != INT_MAX ? j.bad.load() : -1;
}

void check_max_len(const TextEncoder& tok, int max_len) {
  if (max_len > 0 && max_len < tok.num_special())
    throw nb::value_error("max_len is smaller than the special tokens the template adds");
}

nb::tuple encode_packed(const TextEncoder& tok, nb::handle texts, bool truncate, int position_offset, int nthreads,
                        int max_len) {
  check_max_len(tok, max_len);
  Texts t;
  read_texts(texts, t);
  const int B = t.size();
  std::unique_ptr<std::vector<int32_t>> cu_own(new std::vector<int32_t>(B + 1, 0));  // lens, then cu_seqlens
  std::unique_ptr<std::vector<int32_t>> ids(new std::vector<int32_t>());
  std::unique_ptr<std::vector<int32_t>> pos(new std::vector<int32_t>());
  int bad;
  {
    nb::gil_scoped_release nogil;
    bad = tokenize_run(tok, t.s.data(), t.n.data(), B, t.total, truncate, max_len, nthreads, *ids,
                       cu_own->data() + 1);
    // lens -> cu_seqlens, positions
    int32_t* cu = cu_own->data();
    cu[0] = 0;
    for (int i = 0; i < B; ++i) cu[i + 1] += cu[i];
    pos->resize(ids->size());
    int32_t* P = pos->data();
    for (int i = 0; i < B; ++i)
      for (int32_t k = cu[i], v = position_offset; k < cu[i + 1]; ++k, ++v) P[k] = v;
  }
  Out a = own(ids.release()), b = own(pos.release()), c = own(cu_own.release());
  return nb::make_tuple(a, b, c, bad);
}

// Texts tokenised chunk by chunk into the caller's staging buffers: each fill() packs the
// next chunk of the greedy split Engine uses (consecutive texts while the tokens stay within
// max_tokens and the texts within max_seqs), so a pipelined encode tokenises chunk i+1 while
// the backend runs chunk i. Texts are tokenised ahead in runs sized from the bytes per token
// seen so far (big runs on the pool); what a chunk does not take waits for the next one.
class Stream {
 public:
  Stream(const TextEncoder& tok, nb::handle texts, bool truncate, int position_offset, int nthreads, int max_len)
      : tok_(tok), truncate_(truncate), offset_(position_offset), nthreads_(nthreads), max_len_(max_len) {
    check_max_len(tok, max_len);
    read_texts(texts, t_);
  }

  // (n, T, bad): n texts, T tokens written to ids[:T], positions[:T], cu[:n+1]; n == 0 at the
  // end. bad >= 0: that text is over the limit (truncate=false); the stream stops there.
  nb::tuple fill(Buf ids, Buf pos, Buf cu, long max_tokens, long max_seqs) {
    if (max_tokens < 1 || max_seqs < 1) throw nb::value_error("max_tokens and max_seqs must be >= 1");
    if (ids.shape(0) < static_cast<size_t>(max_tokens) || pos.shape(0) < static_cast<size_t>(max_tokens) ||
        cu.shape(0) < static_cast<size_t>(max_seqs) + 1)
      throw nb::value_error("staging buffers must hold max_tokens ids / positions and max_seqs + 1 offsets");
    int32_t *I = ids.data(), *P = pos.data(), *C = cu.data();
    long T = 0, b = 0;
    bool too_long = false;
    {
      nb::gil_scoped_release nogil;
      C[0] = 0;
      while (b < max_seqs && bad_ < 0) {
        if (pli_ == plens_.size()) {
          if (next_ >= t_.size()) break;
          ahead(max_tokens - T, max_seqs - b);
          if (bad_ >= 0) break;
        }
        const long len = plens_[pli_];
        if (T + len > max_tokens) {
          too_long = b == 0;
          break;
        }
        std::copy(pids_.begin() + pat_, pids_.begin() + pat_ + len, I + T);
        for (long k = 0; k < len; ++k) P[T + k] = static_cast<int32_t>(offset_ + k);
        pat_ += len;
        ++pli_;
        T += len;
        C[++b] = static_cast<int32_t>(T);
      }
      done_ += static_cast<int>(b);
    }
    if (too_long)
      throw nb::value_error(("texts[" + std::to_string(done_) + "] has more tokens than max_tokens=" +
                             std::to_string(max_tokens)).c_str());
    return nb::make_tuple(b, T, bad_);
  }

  int size() const { return t_.size(); }
  int done() const { return done_; }          // texts handed out by fill
  int tokenised() const { return next_; }     // texts tokenised so far (ahead of done)

 private:
  // tokenise the next run of texts: about `want_tokens` tokens' worth of bytes, at most
  // want_seqs texts (at least one), appended to the pending store
  void ahead(long want_tokens, long want_seqs) {
    if (pli_ > 0) {  // drop what was consumed
      pids_.erase(pids_.begin(), pids_.begin() + pat_);
      plens_.erase(plens_.begin(), plens_.begin() + pli_);
      pat_ = pli_ = 0;
    }
    const double want_bytes = static_cast<double>(want_tokens) * (seen_bytes_ + 64.0) / (seen_tokens_ + 16.0);
    const int B = t_.size();
    int e = next_;
    size_t bytes = 0;
    while (e < B && e - next_ < want_seqs && (e == next_ || static_cast<double>(bytes) < want_bytes)) bytes += t_.n[e++];
    const int k = e - next_;
    const size_t before = pids_.size();
    const size_t at = plens_.size();
    plens_.resize(at + k);
    const int bad = tokenize_run(tok_, t_.s.data() + next_, t_.n.data() + next_, k, bytes, truncate_, max_len_,
                                 nthreads_, pids_, plens_.data() + at);
    if (bad >= 0) bad_ = next_ + bad;
    seen_bytes_ += static_cast<double>(bytes);
    seen_tokens_ += static_cast<double>(pids_.size() - before);
    next_ = e;
  }

  const TextEncoder& tok_;
  Texts t_;
  bool truncate_;
  int offset_, nthreads_, max_len_;
  int next_ = 0, done_ = 0, bad_ = -1;
  std::vector<int32_t> pids_, plens_;  // tokenised texts not yet handed out, from pat_ / pli_
  size_t pat_ = 0, pli_ = 0;
  double seen_bytes_ = 0, seen_tokens_ = 0;
};

}  // namespace

void bind_tokenizer(nb::module_& m) {
  nb::class_<TextEncoder>(m, "TextEncoder")
      .def("encode_packed", &encode_packed, "texts"_a, "truncate"_a = true, "position_offset"_a = 0,
           "nthreads"_a = 0, "max_len"_a = 0,
           "(ids, positions, cu_seqlens, bad): texts packed in order (int32); bad is the index of the first "
           "text over max_len (0: the tokenizer's) when truncate=False (else -1; that text's ids are left "
           "out). nthreads 0: the pool for big batches, else the calling thread. Thread-safe; the GIL is "
           "released.")
      .def("stream", [](const TextEncoder& tok, nb::handle texts, bool truncate, int position_offset, int nthreads,
                        int max_len) { return new Stream(tok, texts, truncate, position_offset, nthreads, max_len); },
           "texts"_a, "truncate"_a = true, "position_offset"_a = 0, "nthreads"_a = 0, "max_len"_a = 0,
           nb::keep_alive<0, 1>(), nb::rv_policy::take_ownership,
           "A TokenStream over texts: fill() packs the next chunk into staging buffers (pipelined encode)")
      .def_prop_ro("num_special", &TextEncoder::num_special);

  nb::class_<Stream>(m, "TokenStream")
      .def("fill", &Stream::fill, "ids"_a, "positions"_a, "cu_seqlens"_a, "max_tokens"_a, "max_seqs"_a,
           "(n, T, bad): the next chunk of consecutive texts (at most max_tokens tokens and max_seqs texts, "
           "the greedy split) tokenised into ids[:T], positions[:T], cu_seqlens[:n+1]; n == 0 when every "
           "text is out; bad >= 0 names a text over the limit (truncate=False). GIL released.")
      .def_prop_ro("size", &Stream::size)
      .def_prop_ro("done", &Stream::done)
      .def_prop_ro("tokenised", &Stream::tokenised);

  nb::class_<zoi::tok::WordPiece, TextEncoder>(m, "WordPiece")
      .def("__init__",
           [](zoi::tok::WordPiece* self, const std::vector<std::string>& vocab, const std::vector<int32_t>& ids,
              const std::vector<std::string>& added, const std::vector<int32_t>& added_ids, bool clean_text,
              bool handle_chinese_chars, bool strip_accents, bool lowercase, const std::string& prefix,
              int max_input_chars_per_word, int32_t unk_id, const std::vector<int32_t>& head,
              const std::vector<int32_t>& tail, int max_len) {
             zoi::tok::Config c;
             c.clean_text = clean_text;
             c.handle_chinese_chars = handle_chinese_chars;
             c.strip_accents = strip_accents;
             c.lowercase = lowercase;
             c.prefix = prefix;
             c.max_input_chars_per_word = max_input_chars_per_word;
             c.unk_id = unk_id;
             c.head = head;
             c.tail = tail;
             c.max_len = max_len;
             try {
               new (self) zoi::tok::WordPiece(vocab, ids, added, added_ids, std::move(c));
             } catch (const std::invalid_argument& e) {
               throw nb::value_error(e.what());
             }
           },
           "vocab"_a, "ids"_a, "added"_a, "added_ids"_a, "clean_text"_a, "handle_chinese_chars"_a,
           "strip_accents"_a, "lowercase"_a, "prefix"_a, "max_input_chars_per_word"_a, "unk_id"_a, "head"_a,
           "tail"_a, "max_len"_a)
      .def_prop_ro("vocab_size", &zoi::tok::WordPiece::vocab_size)
      .def_prop_ro("max_len", [](const zoi::tok::WordPiece& t) { return t.config().max_len; });

  nb::class_<zoi::tok::ByteBPE, TextEncoder>(m, "ByteBPE")
      .def("__init__",
           [](zoi::tok::ByteBPE* self, const std::vector<std::string>& vocab, const std::vector<int32_t>& ids,
              const std::vector<std::string>& merges, bool paired, const std::vector<std::string>& added,
              const std::vector<int32_t>& added_ids, const std::vector<int>& added_flags,
              const std::vector<std::string>& norm_added, const std::vector<int32_t>& norm_added_ids,
              const std::vector<int>& norm_added_flags, const std::vector<int>& splits, bool nfc,
              bool ignore_merges, int32_t unk_id, bool fuse_unk, const std::vector<int32_t>& head,
              const std::vector<int32_t>& tail, int max_len) {
             zoi::tok::BpeConfig c;
             c.splits = splits;
             c.nfc = nfc;
             c.ignore_merges = ignore_merges;
             c.unk_id = unk_id;
             c.fuse_unk = fuse_unk;
             c.head = head;
             c.tail = tail;
             c.max_len = max_len;
             std::string err;
             {
               nb::gil_scoped_release nogil;  // a 150k-token vocabulary takes a while to index
               try {
                 new (self) zoi::tok::ByteBPE(vocab, ids, merges, paired, added, added_ids, added_flags, norm_added,
                                              norm_added_ids, norm_added_flags, std::move(c));
               } catch (const std::invalid_argument& e) {
                 err = e.what();
               }
             }
             if (!err.empty()) throw nb::value_error(err.c_str());
           },
           "vocab"_a, "ids"_a, "merges"_a, "paired"_a, "added"_a, "added_ids"_a, "added_flags"_a,
           "norm_added"_a, "norm_added_ids"_a, "norm_added_flags"_a, "splits"_a, "nfc"_a, "ignore_merges"_a, "unk_id"_a, "fuse_unk"_a, "head"_a,
           "tail"_a, "max_len"_a)
      .def_prop_ro("vocab_size", &zoi::tok::ByteBPE::vocab_size)
      .def_prop_ro("max_len", [](const zoi::tok::ByteBPE& t) { return t.config().max_len; })
      .def("normalize", &zoi::tok::ByteBPE::normalize, "text"_a,
           "the text as the normaliser leaves it (NFC, or as it is)")
      .def("pre_tokenize", &zoi::tok::ByteBPE::pre_tokenize, "text"_a,
           "the pre-tokenizer's pieces of a (normalised) text, before the byte-level BPE");

  nb::class_<zoi::tok::SentencePiece, TextEncoder>(m, "SentencePiece")
      .def("__init__",
           [](zoi::tok::SentencePiece* self, bool unigram, const std::vector<std::string>& vocab,
              const std::vector<int32_t>& ids, const std::vector<double>& scores,
              const std::vector<std::string>& merges, nb::bytes charsmap, const std::vector<int>& norm_kinds,
              const std::vector<std::string>& norm_a, const std::vector<std::string>& norm_b,
              const std::vector<int>& norm_n, const std::vector<int>& pre_kinds, const std::vector<std::string>& pre_a,
              const std::vector<int>& pre_n, const std::vector<int>& pre_split, const std::vector<std::string>& added,
              const std::vector<int32_t>& added_ids, const std::vector<int>& added_flags,
              const std::vector<std::string>& norm_added, const std::vector<int32_t>& norm_added_ids,
              const std::vector<int>& norm_added_flags, int32_t unk_id, bool byte_fallback, bool fuse_unk,
              bool ignore_merges, const std::string& cut, const std::vector<int32_t>& head,
              const std::vector<int32_t>& tail, int max_len) {
             zoi::tok::SpConfig c;
             c.unigram = unigram;
             if (norm_a.size() != norm_kinds.size() || norm_b.size() != norm_kinds.size() ||
                 norm_n.size() != norm_kinds.size() || pre_a.size() != pre_kinds.size() ||
                 pre_n.size() != pre_kinds.size() || pre_split.size() != pre_kinds.size())
               throw nb::value_error("normalizer / pre-tokenizer step lists differ in length");
             for (size_t i = 0; i < norm_kinds.size(); ++i)
               c.norm.push_back({norm_kinds[i], norm_a[i], norm_b[i], norm_n[i]});
             for (size_t i = 0; i < pre_kinds.size(); ++i)
               c.pre.push_back({pre_kinds[i], pre_a[i], pre_n[i], static_cast<bool>(pre_split[i])});
             c.unk_id = unk_id;
             c.byte_fallback = byte_fallback;
             c.fuse_unk = fuse_unk;
             c.ignore_merges = ignore_merges;
             c.cut = cut;
             c.head = head;
             c.tail = tail;
             c.max_len = max_len;
             const std::string blob(charsmap.c_str(), charsmap.size());
             std::string err;
             {
               nb::gil_scoped_release nogil;  // a 250k-entry vocabulary takes a while to index
               try {
                 new (self) zoi::tok::SentencePiece(vocab, ids, scores, merges, blob, added, added_ids, added_flags,
                                                    norm_added, norm_added_ids, norm_added_flags, std::move(c));
               } catch (const std::invalid_argument& e) {
                 err = e.what();
               }
             }
             if (!err.empty()) throw nb::value_error(err.c_str());
           },
           "unigram"_a, "vocab"_a, "ids"_a, "scores"_a, "merges"_a, "charsmap"_a, "norm_kinds"_a, "norm_a"_a,
           "norm_b"_a, "norm_n"_a, "pre_kinds"_a, "pre_a"_a, "pre_n"_a, "pre_split"_a, "added"_a, "added_ids"_a,
           "added_flags"_a, "norm_added"_a, "norm_added_ids"_a, "norm_added_flags"_a, "unk_id"_a,
           "byte_fallback"_a, "fuse_unk"_a, "ignore_merges"_a, "cut"_a, "head"_a, "tail"_a, "max_len"_a)
      .def_prop_ro("vocab_size", &zoi::tok::SentencePiece::vocab_size)
      .def_prop_ro("max_len", [](const zoi::tok::SentencePiece& t) { return t.config().max_len; })
      .def("normalize", &zoi::tok::SentencePiece::normalize, "text"_a, "the text as the normalizer leaves it")
      .def("pre_tokenize", &zoi::tok::SentencePiece::pre_tokenize, "text"_a,
           "the pre-tokenizer's words of a (normalised) text, before the model");
}
