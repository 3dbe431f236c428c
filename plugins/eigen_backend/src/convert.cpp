// CSR -> BSR conversion, blocks sorted by block column within each block row: sparsetorch's
// "csr_to_bsr" conversion kernel (its contract: CONVERSION_KERNELS in the core's
// sparsetorch/dispatch/hookspecs.py; the Python side is sparsetorch_eigen/convert.py).
//
// Two passes over the block rows. The first checks each row (columns strictly increasing and
// inside [0, n): otherwise the call declines) and counts the distinct block columns of each block
// row, so that max_blocks is honoured before anything big is allocated. The second writes the
// block columns, the values (as raw words) and optionally each entry's slot.
//
// The distinct block columns of a block row come out sorted without a sort:
//  - one row per block row (bh == 1): the row is sorted, a block starts where c / bw changes;
//  - otherwise a bitmap over the block columns: each entry sets its bit; a running popcount over
//    the words between the smallest and the largest block column (known from the rows' first and
//    last entries) numbers the blocks; an entry's block is the count of the words before its word
//    plus the set bits below it in its word. Work: the entries plus the words spanned;
//  - where the span is much wider than the entries (hypersparse, very wide matrices) or the
//    block columns are too many for a bitmap, the block row's block columns are sorted.
// Both passes choose the same way for a block row (a function of its entries and span only).
//
// The passes run without the GIL; all scratch belongs to the call (no global state).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

namespace py = pybind11;

namespace {

using i64 = std::int64_t;
using u64 = std::uint64_t;
using u32 = std::uint32_t;

// --- c / bw and c % bw -------------------------------------------------------------------------
struct DivPow2 {  // bw a power of two
  unsigned shift;
  u64 mask;
  u64 q(u64 c) const { return c >> shift; }
  u64 r(u64 c, u64) const { return c & mask; }
};

struct DivMul32 {  // c < 2^32 and bw < 2^32: floor(c * ceil'(2^64 / bw) / 2^64) is exact
  u64 mul;
  u64 bw;
  u64 q(u64 c) const { return u64((static_cast<unsigned __int128>(c) * mul) >> 64); }
  u64 r(u64 c, u64 qq) const { return c - qq * bw; }
};

struct Div64 {  // the general case (non-power-of-two bw, columns beyond 2^32)
  u64 bw;
  u64 q(u64 c) const { return c / bw; }
  u64 r(u64 c, u64 qq) const { return c - qq * bw; }
};

// --- values moved as raw words ----------------------------------------------------------------
struct Bytes16 {
  u64 lo, hi;
};
template <int N>
struct RawOf;
template <>
struct RawOf<2> { using type = std::uint16_t; };
template <>
struct RawOf<4> { using type = std::uint32_t; };
template <>
struct RawOf<8> { using type = std::uint64_t; };
template <>
struct RawOf<16> { using type = Bytes16; };

// --- writing the outputs ------------------------------------------------------------------------
// Prefetches [begin, end) for writing, when it is at most kPrefetchMax bytes (a longer stretch is
// written in order, which the hardware prefetches itself).
constexpr std::ptrdiff_t kPrefetchMax = 64 << 10;
inline void prefetch_for_write(const void* begin, const void* end) {
  const char* p = static_cast<const char*>(begin);
  const char* q = static_cast<const char*>(end);
  if (q - p > kPrefetchMax) return;
  for (; p < q; p += 64) __builtin_prefetch(p, 1, 3);
}

// --- shared setup ------------------------------------------------------------------------------
struct Shape {
  i64 bh, bw, bs, m, n, nbr, nbc, nnz;
  bool bitmap;  // a bitmap over the block columns allowed (bh > 1 and not too many block columns)
};

// A pass over the bitmap's words costs about as much as sorting a few entries each: the bitmap is
// used when the words spanned are at most this many per entry (plus a constant), else the sort.
constexpr i64 kWordsPerEntry = 4;
constexpr i64 kWordsSlack = 64;

inline bool use_bitmap(const Shape& s, i64 entries, u64 bc_lo, u64 bc_hi) {
  if (!s.bitmap) return false;
  i64 words = i64(bc_hi >> 6) - i64(bc_lo >> 6) + 1;
  return words <= kWordsPerEntry * entries + kWordsSlack;
}

template <class I>
inline bool strictly_increasing(const I* c, i64 len) {
  unsigned bad = 0;
  for (i64 k = 1; k < len; ++k) bad |= unsigned(c[k] <= c[k - 1]);
  return bad == 0;
}

struct BadPointer {
  i64 row, lo, hi;
};

// Checks the rows of block row `br` (pointers non-decreasing and at most nnz: else throws
// BadPointer; columns strictly increasing and in [0, n): else returns false) and gives the span
// of its block columns. Every later read of ptr and col relies on these checks.
template <class I, class D>
inline bool block_row_span(const Shape& s, const I* ptr, const I* col, i64 br, const D& div, u64& bc_lo,
                           u64& bc_hi) {
  u64 lo = std::numeric_limits<u64>::max(), hi = 0;
  const i64 r0 = br * s.bh;
  for (i64 r = r0; r < r0 + s.bh; ++r) {
    const i64 a = i64(ptr[r]), b = i64(ptr[r + 1]);
    if (b < a || b > s.nnz) throw BadPointer{r, a, b};
    if (a == b) continue;
    if (!strictly_increasing(col + a, b - a)) return false;
    const i64 first = i64(col[a]), last = i64(col[b - 1]);
    if (first < 0 || last >= s.n) return false;
    lo = std::min(lo, u64(first));
    hi = std::max(hi, u64(last));
  }
  bc_lo = lo == std::numeric_limits<u64>::max() ? 0 : div.q(lo);
  bc_hi = div.q(hi);
  return true;
}

struct Scratch {
  std::vector<u64> bits;             // one bit per block column, zero between block rows
  std::vector<u32> before;           // per word: the set bits of the block row's earlier words
  std::vector<i64> row_bj;           // the block columns of one block row (sized after pass 1)
  std::vector<u64> keys;             // sorted block columns of one block row (the sort method)
  explicit Scratch(const Shape& s) {
    if (s.bitmap) {
      bits.assign(size_t((s.nbc + 63) / 64), 0);
      before.assign(bits.size(), 0);
    }
  }
};

// Sets the bits of the block columns of block row r0 / bh. (A bitmap per row, its bits gathered
// in a register while a row stays in one word and merged afterwards, avoided the chains of
// load-or-store on one word but measured twice as slow.)
template <class I, class D>
inline void mark(const Shape& s, const I* __restrict ptr, const I* __restrict col, const D div, Scratch& w,
                 i64 r0) {
  u64* __restrict bits = w.bits.data();
  const i64 lo = i64(ptr[r0]), hi = i64(ptr[r0 + s.bh]);
  for (i64 e = lo; e < hi; ++e) {
    const u64 q = div.q(u64(col[e]));
    bits[q >> 6] |= u64(1) << (q & 63);
  }
}

// --- pass 1: blocks per block row --------------------------------------------------------------
// Writes bp[br + 1] = number of blocks of block row br (bp[0] = 0 is the caller's) and returns the
// total, or -1 when a row is not strictly increasing or holds a column outside [0, n).
template <class I, class D>
i64 count_blocks(const Shape& s, const I* ptr, const I* col, const D& div, Scratch& w, i64* bp) {
  i64 total = 0;
  u64* bits = w.bits.data();
  for (i64 br = 0; br < s.nbr; ++br) {
    const i64 lo = i64(ptr[br * s.bh]), hi = i64(ptr[(br + 1) * s.bh]);
    u64 bc_lo, bc_hi;
    if (!block_row_span(s, ptr, col, br, div, bc_lo, bc_hi)) return -1;
    const i64 entries = hi - lo;
    i64 cnt = 0;
    if (entries == 0) {
    } else if (s.bh == 1) {
      u64 prev = ~u64(0);
      for (i64 e = lo; e < hi; ++e) {
        const u64 q = div.q(u64(col[e]));
        cnt += q != prev;
        prev = q;
      }
    } else if (use_bitmap(s, entries, bc_lo, bc_hi)) {
      mark(s, ptr, col, div, w, br * s.bh);
      for (u64 k = bc_lo >> 6; k <= bc_hi >> 6; ++k) {
        cnt += __builtin_popcountll(bits[k]);
        bits[k] = 0;
      }
    } else {
      auto& keys = w.keys;
      keys.resize(size_t(entries));
      for (i64 e = lo; e < hi; ++e) keys[size_t(e - lo)] = div.q(u64(col[e]));
      std::sort(keys.begin(), keys.end());
      cnt = std::unique(keys.begin(), keys.end()) - keys.begin();
    }
    total += cnt;
    bp[br + 1] = cnt;
  }
  return total;
}

// --- pass 2: bp, bj, values, slots -------------------------------------------------------------
// Where an entry goes. Values move as raw N-byte words (N == 0: no values); every pointer is a
// local copy, so that stores into data, bj or slots never make the compiler reload them.
template <int N, bool Slots>
struct Sink {
  using Raw = typename RawOf<N == 0 ? 8 : N>::type;
  static constexpr bool kPlace = N != 0 || Slots;  // anything to do per entry beyond the block columns
  Raw* data;  // the block row's first block
  const Raw* vals;
  i64* slots;
  i64 first_slot;  // the block row's first slot in data
  i64 bs, bw;
  // entry e, in row rr of its block row (row % bh), remainder rem = col % bw, in the block row's
  // block k
  void put(i64 e, i64 k, i64 rr, i64 rem) const {
    const i64 at = k * bs + rr * bw + rem;
    if constexpr (N != 0) data[at] = vals[e];
    if constexpr (Slots) slots[e] = first_slot + at;
  }
};

// While block row br is filled, the outputs of block row br + kAhead are prefetched for writing:
// a block row's values and block columns land in no particular order, and each store to a line
// not yet in cache waited for it (benchmarks/convert_bsr.py, BSR(2, 2): from about 1.0 of SciPy's
// tobsr time to about 0.85).
constexpr i64 kAhead = 4;

// data of at least this many bytes is allocated zeroed (see csr_to_bsr).
constexpr i64 kZeroedBytes = i64(32) << 20;

// Block row r0 / bh (entries lo..hi, more than one row) of pass 2: cnt blocks from bj[base].
template <class I, class D, class S>
void block_row(const Shape& s, const I* __restrict ptr, const I* __restrict col, const D div, Scratch& w, i64 r0,
               i64 lo, i64 hi, i64 base, i64 cnt, i64* __restrict bj, const S sink) {
  constexpr bool kPlace = S::kPlace;
  const i64 bh = s.bh, entries = hi - lo;
  u64* __restrict bits = w.bits.data();
  u32* __restrict before = w.before.data();
  i64* __restrict row_bj = w.row_bj.data();
  u64 lo_c = std::numeric_limits<u64>::max(), hi_c = 0;  // the span (checked in pass 1)
  for (i64 r = r0; r < r0 + bh; ++r) {
    const i64 a = i64(ptr[r]), b = i64(ptr[r + 1]);
    if (a == b) continue;
    lo_c = std::min(lo_c, u64(col[a]));
    hi_c = std::max(hi_c, u64(col[b - 1]));
  }
  const u64 bc_lo = div.q(lo_c), bc_hi = div.q(hi_c);
  if (use_bitmap(s, entries, bc_lo, bc_hi)) {
    mark(s, ptr, col, div, w, r0);
    // A block column's number in the block row: the set bits of the words before its word
    // (a running count per word) plus those below it in its word. No branch on the bits (a
    // scan listing them mispredicted about once per word: a word holds a block column or two
    // where the bitmap is chosen), and each entry writes its block column (repeats agree) to a
    // buffer in cache, copied to bj afterwards.
    const u64 w0 = bc_lo >> 6, w1 = bc_hi >> 6;
    u32 acc = 0;
    for (u64 wd = w0; wd <= w1; ++wd) {
      before[wd] = acc;
      acc += u32(__builtin_popcountll(bits[wd]));
    }
    for (i64 rr = 0; rr < bh; ++rr) {
      const i64 a = i64(ptr[r0 + rr]), b = i64(ptr[r0 + rr + 1]);
      for (i64 e = a; e < b; ++e) {
        const u64 c = u64(col[e]);
        const u64 q = div.q(c);
        const u64 wd = q >> 6;
        const i64 k = i64(before[wd]) + __builtin_popcountll(bits[wd] & ((u64(1) << (q & 63)) - 1));
        row_bj[k] = i64(q);
        if constexpr (kPlace) sink.put(e, k, rr, i64(div.r(c, q)));
      }
    }
    std::fill(bits + w0, bits + w1 + 1, u64(0));
    std::memcpy(bj + base, row_bj, size_t(cnt) * sizeof(i64));
  } else {
    auto& keys = w.keys;
    keys.resize(size_t(entries));
    for (i64 e = lo; e < hi; ++e) keys[size_t(e - lo)] = div.q(u64(col[e]));
    std::sort(keys.begin(), keys.end());
    const auto end = std::unique(keys.begin(), keys.end());
    for (i64 k = 0; k < cnt; ++k) bj[base + k] = i64(keys[size_t(k)]);
    if constexpr (kPlace) {
      for (i64 rr = 0; rr < bh; ++rr) {
        const i64 a = i64(ptr[r0 + rr]), b = i64(ptr[r0 + rr + 1]);
        auto from = keys.begin();  // the row's block columns increase: search on from the last one
        for (i64 e = a; e < b; ++e) {
          const u64 c = u64(col[e]);
          const u64 q = div.q(c);
          from = std::lower_bound(from, end, q);
          sink.put(e, i64(from - keys.begin()), rr, i64(div.r(c, q)));
        }
      }
    }
  }
}

// Pass 2 over all block rows. data comes zeroed (zeroed = true) or uninitialized: then each block
// row's blocks are zeroed just before its values land in them.
template <class I, class D, int N, bool Slots>
void fill_blocks(const Shape& s, const I* __restrict ptr, const I* __restrict col, const D div, Scratch& w,
                 const i64* __restrict bp, i64* __restrict bj, const void* vals, void* data, bool zeroed,
                 i64* slots) {
  using S = Sink<N, Slots>;
  using Raw = typename S::Raw;
  Raw* const out = static_cast<Raw*>(data);
  constexpr bool kPlace = S::kPlace;
  const i64 bh = s.bh, nbr = s.nbr, bs = s.bs;
  for (i64 br = 0; br < nbr; ++br) {
    const i64 r0 = br * bh;
    const i64 lo = i64(ptr[r0]), hi = i64(ptr[r0 + bh]);
    if (lo == hi) continue;
    const i64 base = bp[br], cnt = bp[br + 1] - base;
    if (br + kAhead < nbr) {
      const i64 b0 = bp[br + kAhead], b1 = bp[br + kAhead + 1];
      if constexpr (N != 0) prefetch_for_write(out + b0 * bs, out + b1 * bs);
      prefetch_for_write(bj + b0, bj + b1);
      if constexpr (Slots) prefetch_for_write(slots + ptr[(br + kAhead) * bh], slots + ptr[(br + kAhead + 1) * bh]);
    }
    const S sink{out + base * bs, static_cast<const Raw*>(vals), slots, base * bs, bs, s.bw};
    if constexpr (N != 0)
      if (!zeroed) std::memset(sink.data, 0, size_t(cnt * bs) * sizeof(Raw));
    if (bh == 1) {  // one sorted row: a block starts where the block column changes
      i64 blk = base - 1;
      u64 prev = ~u64(0);
      for (i64 e = lo; e < hi; ++e) {
        const u64 c = u64(col[e]);
        const u64 q = div.q(c);
        blk += q != prev;
        prev = q;
        bj[blk] = i64(q);
        if constexpr (kPlace) sink.put(e, blk - base, 0, i64(div.r(c, q)));
      }
    } else {
      block_row(s, ptr, col, div, w, r0, lo, hi, base, cnt, bj, sink);
    }
  }
}

// --- dispatch over the template parameters -----------------------------------------------------
template <class I, class D>
i64 count_with(const Shape& s, const void* ptr, const void* col, const D& div, Scratch& w, i64* bp) {
  return count_blocks<I, D>(s, static_cast<const I*>(ptr), static_cast<const I*>(col), div, w, bp);
}

struct Outputs {
  const i64* bp;
  i64* bj;
  int itemsize;      // 0: no values
  const void* vals;
  void* data;
  bool zeroed;       // data was allocated zeroed
  i64* slots;        // or nullptr
};

template <class I, class D, int N>
void fill_n(const Shape& s, const void* ptr, const void* col, const D& div, Scratch& w, const Outputs& o) {
  const I* p = static_cast<const I*>(ptr);
  const I* c = static_cast<const I*>(col);
  if (o.slots)
    fill_blocks<I, D, N, true>(s, p, c, div, w, o.bp, o.bj, o.vals, o.data, o.zeroed, o.slots);
  else
    fill_blocks<I, D, N, false>(s, p, c, div, w, o.bp, o.bj, o.vals, o.data, o.zeroed, nullptr);
}

template <class I, class D>
void fill_with(const Shape& s, const void* ptr, const void* col, const D& div, Scratch& w, const Outputs& o) {
  switch (o.itemsize) {
    case 0: return fill_n<I, D, 0>(s, ptr, col, div, w, o);
    case 2: return fill_n<I, D, 2>(s, ptr, col, div, w, o);
    case 4: return fill_n<I, D, 4>(s, ptr, col, div, w, o);
    case 8: return fill_n<I, D, 8>(s, ptr, col, div, w, o);
    default: return fill_n<I, D, 16>(s, ptr, col, div, w, o);
  }
}

// Runs f(div) with the divider that fits bw and n.
template <class F>
void with_divider(const Shape& s, F&& f) {
  const u64 bw = u64(s.bw);
  if ((bw & (bw - 1)) == 0) {
    f(DivPow2{unsigned(__builtin_ctzll(bw)), bw - 1});
  } else if (u64(s.n) <= (u64(1) << 32)) {
    f(DivMul32{u64(~u64(0) / bw + 1), bw});  // floor(2^64 / bw) + 1 (bw is not a power of two)
  } else {
    f(Div64{bw});
  }
}

std::string str(i64 v) { return std::to_string(v); }

void check_array(const py::array& a, const char* name) {
  if (a.ndim() != 1)
    throw py::value_error(std::string("csr_to_bsr: ") + name + " must be 1-D, got " + str(a.ndim()) +
                          " dimensions");
  if (a.shape(0) > 1 && a.strides(0) != a.itemsize())
    throw py::value_error(std::string("csr_to_bsr: ") + name + " must be contiguous, got stride " +
                          str(a.strides(0)) + " bytes for itemsize " + str(a.itemsize()));
}

template <class I>
i64 at(const py::array& a, i64 k) {
  return i64(static_cast<const I*>(a.data())[k]);
}

py::object csr_to_bsr(i64 bh, i64 bw, i64 m, i64 n, const py::array& ptr, const py::array& col,
                      const py::object& vals_obj, i64 max_blocks, bool want_slots) {
  const std::string fn = "csr_to_bsr: ";
  if (bh < 1 || bw < 1)
    throw py::value_error(fn + "block sizes must be positive, got (" + str(bh) + ", " + str(bw) + ")");
  if (m < 0 || n < 0) throw py::value_error(fn + "negative shape (" + str(m) + ", " + str(n) + ")");
  if (m % bh != 0 || n % bw != 0)
    throw py::value_error(fn + "shape (" + str(m) + ", " + str(n) + ") is not a multiple of the block size (" +
                          str(bh) + ", " + str(bw) + ")");
  if (max_blocks < 0) throw py::value_error(fn + "max_blocks must be >= 0, got " + str(max_blocks));
  i64 bs;
  if (__builtin_mul_overflow(bh, bw, &bs)) throw py::value_error(fn + "block size too large");
  check_array(ptr, "ptr");
  check_array(col, "col");
  const auto i32 = py::dtype::of<std::int32_t>(), i64t = py::dtype::of<std::int64_t>();
  const bool idx64 = ptr.dtype().equal(i64t);
  if (!(idx64 || ptr.dtype().equal(i32)))
    throw py::value_error(fn + "ptr must be int32 or int64, got " + std::string(py::str(ptr.dtype())));
  if (!col.dtype().equal(ptr.dtype()))
    throw py::value_error(fn + "col's dtype (" + std::string(py::str(col.dtype())) + ") differs from ptr's (" +
                          std::string(py::str(ptr.dtype())) + ")");
  for (const py::array* a : {&ptr, &col})
    if (reinterpret_cast<std::uintptr_t>(a->data()) % std::uintptr_t(a->itemsize()) != 0)
      throw py::value_error(fn + (a == &ptr ? "ptr" : "col") + " is not aligned to its itemsize");
  if (ptr.shape(0) != m + 1)
    throw py::value_error(fn + "ptr has " + str(ptr.shape(0)) + " entries, expected m + 1 = " + str(m + 1));
  const i64 nnz = col.shape(0);
  const i64 p0 = idx64 ? at<std::int64_t>(ptr, 0) : at<std::int32_t>(ptr, 0);
  const i64 pm = idx64 ? at<std::int64_t>(ptr, m) : at<std::int32_t>(ptr, m);
  if (p0 != 0) throw py::value_error(fn + "ptr[0] is " + str(p0) + ", expected 0");
  if (pm != nnz) throw py::value_error(fn + "col has " + str(nnz) + " entries, expected ptr[m] = " + str(pm));

  py::array vals;
  int itemsize = 0;
  if (!vals_obj.is_none()) {
    if (!py::isinstance<py::array>(vals_obj))
      throw py::value_error(fn + "vals must be a NumPy array or None, got " +
                            std::string(py::str(py::type::of(vals_obj))));
    vals = py::reinterpret_borrow<py::array>(vals_obj);
    check_array(vals, "vals");
    if (vals.shape(0) != nnz)
      throw py::value_error(fn + "vals has " + str(vals.shape(0)) + " entries, expected nnz = " + str(nnz));
    itemsize = int(vals.itemsize());
    if (itemsize != 2 && itemsize != 4 && itemsize != 8 && itemsize != 16) return py::none();  // decline
    if (vals.dtype().attr("hasobject").cast<bool>()) return py::none();  // references: not raw bytes
    if (reinterpret_cast<std::uintptr_t>(vals.data()) % std::uintptr_t(std::min(itemsize, 8)) != 0)
      return py::none();  // values are moved as aligned words
  }

  Shape s{bh, bw, bs, m, n, m / bh, n / bw, nnz, false};
  // A bitmap (and its per-word counts, and a row of block columns) over the block columns where it
  // stays about the size of the input.
  s.bitmap = bh > 1 && s.nbc <= 2 * nnz + 65536 && s.nbc < (i64(1) << 32);

  py::array_t<i64> bp(s.nbr + 1);
  i64* bpd = bp.mutable_data();
  bpd[0] = 0;
  const void* pd = ptr.data();
  const void* cd = col.data();
  Scratch w(s);
  i64 total = 0;
  BadPointer bad{-1, 0, 0};
  {
    py::gil_scoped_release nogil;
    try {
      with_divider(s, [&](auto div) {
        total = idx64 ? count_with<std::int64_t>(s, pd, cd, div, w, bpd) : count_with<std::int32_t>(s, pd, cd, div, w, bpd);
      });
    } catch (const BadPointer& b) {
      bad = b;
    }
    if (bad.row < 0 && total >= 0) {
      i64 widest = 0;  // the most blocks in a block row
      for (i64 br = 0; br < s.nbr; ++br) {
        widest = std::max(widest, bpd[br + 1]);
        bpd[br + 1] += bpd[br];
      }
      if (s.bitmap && total <= max_blocks) w.row_bj.resize(size_t(widest));
    }
  }
  if (bad.row >= 0)
    throw py::value_error(fn + "ptr decreases at row " + str(bad.row) + ": ptr[" + str(bad.row) + "] = " +
                          str(bad.lo) + ", ptr[" + str(bad.row + 1) + "] = " + str(bad.hi) + " (nnz = " + str(nnz) +
                          ")");
  if (total < 0) return py::none();  // a row not strictly increasing, or a column outside [0, n)
  if (total > max_blocks) return py::int_(total);
  i64 nslots;
  if (__builtin_mul_overflow(total, bs, &nslots))
    throw py::value_error(fn + str(total) + " blocks of " + str(bs) + " slots overflow int64");

  py::array_t<i64> bj(total);
  Outputs o{bpd, bj.mutable_data(), itemsize, itemsize ? vals.data() : nullptr, nullptr, false, nullptr};
  py::object data = py::none(), slots = py::none();
  if (itemsize) {
    // A large array comes from the OS (glibc: from 32 MiB on, always), zeroed as its pages are
    // first touched: np.zeros costs nothing more there. A smaller one may be reused memory, which
    // np.zeros (calloc) clears in a pass of its own: it is cheaper to clear each block row's blocks
    // just before they are filled, while they are in cache.
    o.zeroed = nslots >= kZeroedBytes / itemsize;
    py::array d = o.zeroed ? py::array(py::module_::import("numpy").attr("zeros")(nslots, vals.dtype()))
                           : py::array(vals.dtype(), std::vector<py::ssize_t>{py::ssize_t(nslots)});
    o.data = d.mutable_data();
    data = std::move(d);
  }
  if (want_slots) {
    py::array_t<i64> sl(nnz);
    o.slots = sl.mutable_data();
    slots = std::move(sl);
  }
  {
    py::gil_scoped_release nogil;
    with_divider(s, [&](auto div) {
      using D = decltype(div);
      if (idx64)
        fill_with<std::int64_t, D>(s, pd, cd, div, w, o);
      else
        fill_with<std::int32_t, D>(s, pd, cd, div, w, o);
    });
  }
  return py::make_tuple(bp, bj, data, slots);
}

}  // namespace

void register_convert(py::module_& m) {
  m.def("csr_to_bsr", &csr_to_bsr, py::arg("bh"), py::arg("bw"), py::arg("m"), py::arg("n"), py::arg("ptr"),
        py::arg("col"), py::arg("vals"), py::arg("max_blocks"), py::arg("want_slots"),
        "CSR -> BSR with the blocks of each block row sorted by block column (sparsetorch's csr_to_bsr "
        "conversion kernel): (bp, bj, data, slots), the block count when it exceeds max_blocks, or None "
        "to decline (an unsupported itemsize, a row not strictly increasing or a column outside [0, n)).");
}
