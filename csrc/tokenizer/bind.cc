// zoi._cpu.WordPiece: the native tokenizer's Python binding. A batch is read under the GIL
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
#include "tokenizer/wordpiece.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace {

using Out = nb::ndarray<nb::numpy, int32_t, nb::ndim<1>>;

Out own(std::vector<int32_t>* v) {
  nb::capsule owner(v, [](void* p) noexcept { delete static_cast<std::vector<int32_t>*>(p); });
  return Out(v->data(), {v->size()}, owner);
}

constexpr size_t kParallelBytes = 16384;  // smaller batches run on the calling thread
constexpr int kBlock = 8;                 // texts claimed at a time by a pool thread

struct Batch {
  const zoi::tok::WordPiece* tok;
  const char* const* s;
  const size_t* n;
  int B;
  bool truncate;
  int max_len;
  int nblocks;
  std::vector<std::vector<int32_t>>* blocks;
  int32_t* lens;
  std::atomic<int> next{0};
  std::atomic<int> bad{INT_MAX};

  void block(int b, std::vector<int32_t>& out) {
    for (int i = b * kBlock, e = std::min(B, (b + 1) * kBlock); i < e; ++i) {
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

nb::tuple encode_packed(const zoi::tok::WordPiece& tok, nb::handle texts, bool truncate, int position_offset,
                        int nthreads, int max_len) {
  if (max_len > 0 && max_len < tok.num_special())
    throw nb::value_error("max_len is smaller than the special tokens the template adds");
  if (PyUnicode_Check(texts.ptr()) || PyBytes_Check(texts.ptr()))
    throw nb::type_error("expected a list of str, got a single str");
  nb::object tup = nb::steal(PySequence_Tuple(texts.ptr()));  // holds every text while the GIL is released
  if (!tup.is_valid()) {
    PyErr_Clear();
    throw nb::type_error(("texts should be a str or a list of str, got " +
                          std::string(Py_TYPE(texts.ptr())->tp_name)).c_str());
  }
  const Py_ssize_t B = PyTuple_GET_SIZE(tup.ptr());
  if (B > INT_MAX / 2) throw nb::value_error("too many texts in one call");
  std::vector<const char*> s(B);
  std::vector<size_t> n(B);
  size_t total = 0;
  for (Py_ssize_t i = 0; i < B; ++i) {
    PyObject* t = PyTuple_GET_ITEM(tup.ptr(), i);
    if (!PyUnicode_Check(t))
      throw nb::type_error(("texts[" + std::to_string(i) + "] is " + Py_TYPE(t)->tp_name + ", expected str").c_str());
    Py_ssize_t len;
    const char* p = PyUnicode_AsUTF8AndSize(t, &len);
    if (!p) bad_unicode(t, i);
    s[i] = p;
    n[i] = static_cast<size_t>(len);
    total += n[i];
  }
  std::unique_ptr<std::vector<int32_t>> cu_own(new std::vector<int32_t>(B + 1, 0));  // lens, then cu_seqlens
  std::unique_ptr<std::vector<int32_t>> ids(new std::vector<int32_t>());
  std::unique_ptr<std::vector<int32_t>> pos(new std::vector<int32_t>());
  std::vector<int32_t>* lens = cu_own.get();
  int bad = -1;
  {
    nb::gil_scoped_release nogil;
    int nt = nthreads;
    if (nt <= 0) nt = total >= kParallelBytes ? zoi::ThreadPool::instance().size() : 1;
    const int nblocks = static_cast<int>((B + kBlock - 1) / kBlock);
    if (nt > nblocks) nt = nblocks;
    int32_t* L = lens->data() + 1;
    if (nt <= 1) {
      ids->reserve(total / 3 + 4 * B + 16);
      for (Py_ssize_t i = 0; i < B; ++i) {
        const size_t mark = ids->size();
        if (!tok.encode(s[i], n[i], truncate, *ids, max_len)) {
          ids->resize(mark);
          if (bad < 0) bad = static_cast<int>(i);
        }
        L[i] = static_cast<int32_t>(ids->size() - mark);
      }
    } else {
      std::vector<std::vector<int32_t>> blocks(nblocks);
      Batch j{&tok, s.data(), n.data(), static_cast<int>(B), truncate, max_len, nblocks, &blocks, L};
      zoi::ThreadPool::instance().run(&Batch::job, &j, nt);
      size_t T = 0;
      for (auto& b : blocks) T += b.size();
      ids->resize(T);
      size_t at = 0;
      for (auto& b : blocks) {
        std::copy(b.begin(), b.end(), ids->begin() + at);
        at += b.size();
      }
      if (j.bad.load() != INT_MAX) bad = j.bad.load();
    }
    // lens -> cu_seqlens, positions
    int32_t* cu = lens->data();
    cu[0] = 0;
    for (Py_ssize_t i = 0; i < B; ++i) cu[i + 1] += cu[i];
    pos->resize(ids->size());
    int32_t* P = pos->data();
    for (Py_ssize_t i = 0; i < B; ++i)
      for (int32_t k = cu[i], v = position_offset; k < cu[i + 1]; ++k, ++v) P[k] = v;
  }
  Out a = own(ids.release()), b = own(pos.release()), c = own(cu_own.release());
  return nb::make_tuple(a, b, c, bad);
}

}  // namespace

void bind_tokenizer(nb::module_& m) {
  nb::class_<zoi::tok::WordPiece>(m, "WordPiece")
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
      .def("encode_packed", &encode_packed, "texts"_a, "truncate"_a = true, "position_offset"_a = 0,
           "nthreads"_a = 0, "max_len"_a = 0,
           "(ids, positions, cu_seqlens, bad): texts packed in order (int32); bad is the index of the first "
           "text over max_len (0: the tokenizer's) when truncate=False (else -1; that text's ids are left "
           "out). nthreads 0: the pool for big batches, else the calling thread. Thread-safe; the GIL is "
           "released.")
      .def_prop_ro("vocab_size", &zoi::tok::WordPiece::vocab_size)
      .def_prop_ro("num_special", &zoi::tok::WordPiece::num_special)
      .def_prop_ro("max_len", [](const zoi::tok::WordPiece& t) { return t.config().max_len; });
}
