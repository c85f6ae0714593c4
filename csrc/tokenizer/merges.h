// The BPE merge step of both BPE tokenizers (byte-level BPE over bytes, SentencePiece BPE over
// characters): the merge table and HF's BPE::merge_word + Word::merge_all over one word's
// symbols. One implementation, so the two families cannot drift apart in tie-breaking.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace zoi::tok {

// (a, b) -> (rank, merged id), open addressing over a power-of-two table (key ~0: empty).
class MergeTable {
 public:
  // room for n merges at a load factor under 1/2 (probe chains stay short)
  void reserve(size_t n) {
    size_t cap = 16;
    while (cap < n * 2 + 2) cap <<= 1;
    slots_.assign(cap, Slot{~0ull, 0});
    mask_ = cap - 1;
  }
  // a later duplicate pair replaces the earlier one's rank, as HF reads merges
  void set(int32_t a, int32_t b, uint32_t rank, int32_t id) {
    const uint64_t key = key_of(a, b);
    size_t h = hash(key) & mask_;
    while (slots_[h].key != ~0ull && slots_[h].key != key) h = (h + 1) & mask_;
    slots_[h] = {key, static_cast<uint64_t>(rank) << 32 | static_cast<uint32_t>(id)};
  }
  bool find(int32_t a, int32_t b, uint32_t* rank, int32_t* id) const {
    const uint64_t key = key_of(a, b);
    for (size_t h = hash(key) & mask_;; h = (h + 1) & mask_) {
      const Slot& e = slots_[h];
      if (e.key == key) {
        *rank = static_cast<uint32_t>(e.val >> 32);
        *id = static_cast<int32_t>(static_cast<uint32_t>(e.val));
        return true;
      }
      if (e.key == ~0ull) return false;
    }
  }
  void prefetch(int32_t a, int32_t b) const { __builtin_prefetch(&slots_[hash(key_of(a, b)) & mask_]); }

 private:
  struct Slot {
    uint64_t key, val;
  };
  static uint64_t key_of(int32_t a, int32_t b) {
    return static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32 | static_cast<uint32_t>(b);
  }
  static uint64_t hash(uint64_t key) {
    key *= 0x9E3779B97F4A7C15ull;
    return key ^ (key >> 32);
  }
  std::vector<Slot> slots_;
  size_t mask_ = 0;
};

// per-thread buffers of a long word's merge (the priority-queue form)
struct MergeScratch {
  struct Sym {
    int32_t c, prev, next;
    uint32_t len;
  };
  struct Pending {
    uint32_t rank, pos;
    int32_t id;
  };
  std::vector<Sym> hs;
  std::vector<Pending> heap;
};

// Merges the symbols `sym` (overwritten) and appends the resulting ids to `out`: the pair of
// lowest rank first, the leftmost of equal ranks. Short words keep their pairs' ranks in an
// array; long ones run HF's own priority queue, so a 10,000-symbol word costs n log n.
// Table: find(a, b, &rank, &id) and prefetch(a, b), as MergeTable.
template <class Table>
void merge_word(const Table& merges, std::vector<int32_t>& sym, std::vector<int32_t>& out, MergeScratch& sc) {
  const size_t m = sym.size();
  if (m <= 1) {
    out.insert(out.end(), sym.begin(), sym.end());
    return;
  }
  if (m <= 64) {
    // pairs keyed rank << 32 | position (positions never move; a merged-away symbol and a
    // pair without a merge hold ~0): the smallest key is the lowest rank, leftmost
    uint64_t key[64];
    int32_t nid[64];
    uint8_t nxt[64], prv[64];
    auto pair_key = [&](size_t k, size_t j) -> uint64_t {
      uint32_t r;
      return merges.find(sym[k], sym[j], &r, &nid[k]) ? (static_cast<uint64_t>(r) << 32 | k) : ~0ull;
    };
    for (size_t k = 0; k < m; ++k) {
      nxt[k] = static_cast<uint8_t>(k + 1);
      prv[k] = static_cast<uint8_t>(k - 1);  // wraps for k = 0: never read there
    }
    // the pairs' slots fetched together: a cold word waits for memory once, not per pair
    for (size_t k = 0; k + 1 < m; ++k) merges.prefetch(sym[k], sym[k + 1]);
    for (size_t k = 0; k + 1 < m; ++k) key[k] = pair_key(k, k + 1);
    key[m - 1] = ~0ull;
    for (;;) {
      uint64_t best = ~0ull;
      for (size_t k = 0; k + 1 < m; ++k) best = key[k] < best ? key[k] : best;
      if (best == ~0ull) break;
      const size_t k = static_cast<uint32_t>(best);
      const size_t j = nxt[k];  // merged into k
      sym[k] = nid[k];
      key[j] = ~0ull;
      nxt[k] = nxt[j];
      if (nxt[j] < m) prv[nxt[j]] = static_cast<uint8_t>(k);
      key[k] = nxt[k] < m ? pair_key(k, nxt[k]) : ~0ull;
      if (k > 0) key[prv[k]] = pair_key(prv[k], k);  // a merge keeps its left position
    }
    for (size_t k = 0; k < m; k = nxt[k]) out.push_back(sym[k]);
    return;
  }
  using Sym = MergeScratch::Sym;
  using Pending = MergeScratch::Pending;
  std::vector<Sym>& hs = sc.hs;
  std::vector<Pending>& heap = sc.heap;
  hs.resize(m);
  heap.clear();
  // std heap is a max-heap: "less" puts the lowest rank, then the lowest position, on top
  auto less = [](const Pending& a, const Pending& b) { return a.rank != b.rank ? a.rank > b.rank : a.pos > b.pos; };
  for (size_t k = 0; k < m; ++k)
    hs[k] = {sym[k], static_cast<int32_t>(k) - 1, k + 1 < m ? static_cast<int32_t>(k + 1) : -1, 1};
  for (size_t k = 0; k + 1 < m; ++k) {
    uint32_t r;
    int32_t id;
    if (merges.find(sym[k], sym[k + 1], &r, &id)) heap.push_back({r, static_cast<uint32_t>(k), id});
  }
  std::make_heap(heap.begin(), heap.end(), less);
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), less);
    const Pending top = heap.back();
    heap.pop_back();
    Sym& cur = hs[top.pos];
    if (cur.len == 0 || cur.next < 0) continue;
    const int32_t next_pos = cur.next;
    const Sym right = hs[next_pos];
    uint32_t r;
    int32_t id;
    if (!merges.find(cur.c, right.c, &r, &id) || id != top.id) continue;  // a stale entry
    cur.c = top.id;
    cur.len += right.len;
    cur.next = right.next;
    hs[next_pos].len = 0;
    if (right.next >= 0) hs[right.next].prev = static_cast<int32_t>(top.pos);
    if (cur.prev >= 0 && merges.find(hs[cur.prev].c, cur.c, &r, &id)) {
      heap.push_back({r, static_cast<uint32_t>(cur.prev), id});
      std::push_heap(heap.begin(), heap.end(), less);
    }
    if (cur.next >= 0 && merges.find(cur.c, hs[cur.next].c, &r, &id)) {
      heap.push_back({r, top.pos, id});
      std::push_heap(heap.begin(), heap.end(), less);
    }
  }
  for (size_t k = 0; k < m; ++k)
    if (hs[k].len) out.push_back(hs[k].c);
}

}  // namespace zoi::tok
