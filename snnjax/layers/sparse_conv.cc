// A 2-D convolution and a matmul that skip the zeros of their input (spikes), for XLA:CPU through the FFI.
//
// SnnSparseConvForward{F32,F64}(x [N, H, W, Ci], w [kh, kw, Ci, Co]) -> y [N, Ho, Wo, Co]
// SnnSparseConvWeightGrad{F32,F64}(x [N, H, W, Ci], g [N, Ho, Wo, Co]) -> dw [kh, kw, Ci, Co]
// attributes: stride_h, stride_w, pad_h, pad_w (leading padding; the output shape sets the rest).
// SnnSparseMatmul{F32,F64}(x [rows, Ci], w [Ci, Co]) -> y [rows, Co]
// SnnSparseMatmulWeightGrad{F32,F64}(x [rows, Ci], g [rows, Co]) -> dw [Ci, Co]
//
// Each first lists the nonzeros of x in the order its loop reads them:
// - forward: per input position (CSR over the N*H*W positions); every output position sums
//   v * w[i, j, c, :] over the nonzeros (c, v) its window reaches, in registers, a block of 64
//   output channels at a time (32, 16 or 8 where 64 does not divide them), from the kernel
//   repacked so that a block's rows are contiguous;
// - kernel gradient: per (channel, stride phase, image, row); for each channel c and tap (i, j),
//   dw[i, j, c, block] sums v * g[p, block] over the nonzeros the tap moves to output position p,
//   in registers, a block of 128 bytes of output channels at a time, from the output gradient
//   copied into a zero-padded layout that stays in cache while every channel and tap reads it (a
//   band of rows of one image in L1, or several small images in L2) and needs no bounds checks.
// The work is proportional to the nonzeros: with spikes (10-20% ones) a fraction of a dense
// convolution's. The matmul's forward sums a row's nonzeros' rows of w, its kernel gradient lists the nonzeros
// per column (below). Work items run on XLA's intra-op thread pool (parallel_chunks.h).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "parallel_chunks.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace snnjax {
namespace {

int64_t FloorDiv(int64_t a, int64_t b) { return a >= 0 ? a / b : -((-a + b - 1) / b); }
int64_t CeilDiv(int64_t a, int64_t b) { return -FloorDiv(-a, b); }
int64_t Mod(int64_t a, int64_t b) { return a - FloorDiv(a, b) * b; }

struct Geometry {
  int64_t n, h, w, ci, kh, kw, co, ho, wo, sh, sw, ph, pw;
};

// The forward's view of x [positions, ci]: its nonzeros per position: start [positions + 1], channel, value.
template <typename F>
struct PositionNonzeros {
  std::vector<int64_t> start;
  std::vector<int32_t> channel;
  std::vector<F> value;
};

constexpr int64_t kRowsPerItem = 64;

template <typename F>
void ListPositionNonzeros(ffi::ThreadPool& pool, const F* x, int64_t positions, int64_t ci, PositionNonzeros<F>& nz) {
  const int64_t items = (positions + kRowsPerItem - 1) / kRowsPerItem;
  nz.start.assign(positions + 1, 0);
  ParallelChunks<F>(pool, items, 1, [&](int64_t item, F*) {
    const int64_t end = std::min(positions, (item + 1) * kRowsPerItem);
    for (int64_t p = item * kRowsPerItem; p < end; ++p) {
      const F* xp = x + p * ci;
      int64_t count = 0;
      for (int64_t c = 0; c < ci; ++c) count += xp[c] != F(0);
      nz.start[p + 1] = count;
    }
  });
  for (int64_t p = 0; p < positions; ++p) nz.start[p + 1] += nz.start[p];
  nz.channel.resize(nz.start[positions]);
  nz.value.resize(nz.start[positions]);
  ParallelChunks<F>(pool, items, 1, [&](int64_t item, F*) {
    const int64_t end = std::min(positions, (item + 1) * kRowsPerItem);
    for (int64_t p = item * kRowsPerItem; p < end; ++p) {
      const F* xp = x + p * ci;
      int64_t k = nz.start[p];
      for (int64_t c = 0; c < ci; ++c) {
        if (xp[c] != F(0)) {
          nz.channel[k] = static_cast<int32_t>(c);
          nz.value[k++] = xp[c];
        }
      }
    }
  });
}

// Vectors of up to 64 bytes (one AVX-512 register; two AVX2 ones where the CPU has no AVX-512), at most a
// block of B channels: the accumulators of one block of output channels stay in registers.
template <typename F, int B>
struct Lanes {
  static constexpr int kBytes = B * int(sizeof(F)) < 64 ? B * int(sizeof(F)) : 64;
  typedef F Vec __attribute__((vector_size(kBytes)));
  static constexpr int kCount = kBytes / int(sizeof(F));
};

template <typename F, int B>
typename Lanes<F, B>::Vec Load(const F* p) {
  typename Lanes<F, B>::Vec v;
  __builtin_memcpy(&v, p, sizeof(v));
  return v;
}

// a += (and b +=, alternately: independent add chains) value[k] * rows[index[k] * stride : +B] over the entries
// [begin, end) of a list: every kernel's inner loop, a block of B channels in registers.
template <typename F, int B, typename I>
inline void SumRows(const F* rows, int64_t stride, const I* index, const F* value, int64_t begin, int64_t end,
                    typename Lanes<F, B>::Vec* a, typename Lanes<F, B>::Vec* b) {
  constexpr int L = Lanes<F, B>::kCount, V = B / L;
  int64_t k = begin;
  for (; k + 1 < end; k += 2) {
    const F* r0 = rows + int64_t(index[k]) * stride;
    const F* r1 = rows + int64_t(index[k + 1]) * stride;
    const F v0 = value[k], v1 = value[k + 1];
#pragma GCC unroll 16
    for (int q = 0; q < V; ++q) {
      a[q] += v0 * Load<F, B>(r0 + q * L);
      b[q] += v1 * Load<F, B>(r1 + q * L);
    }
  }
  if (k < end) {
    const F* r0 = rows + int64_t(index[k]) * stride;
#pragma GCC unroll 16
    for (int q = 0; q < V; ++q) a[q] += value[k] * Load<F, B>(r0 + q * L);
  }
}

// out[0 : B] = a + b.
template <typename F, int B>
inline void StoreSum(F* out, const typename Lanes<F, B>::Vec* a, const typename Lanes<F, B>::Vec* b) {
  constexpr int L = Lanes<F, B>::kCount, V = B / L;
#pragma GCC unroll 16
  for (int q = 0; q < V; ++q) {
    const typename Lanes<F, B>::Vec sum = a[q] + b[q];
    __builtin_memcpy(out + q * L, &sum, sizeof(sum));
  }
}

// Output rows (n, oy) [row0, row1), channels [co0, co0 + B); wp: w packed as [Co / B, kh, kw, Ci, B].
template <typename F, int B>
void ForwardItem(const Geometry& g, const PositionNonzeros<F>& nz, const F* wp, F* y, int64_t row0, int64_t row1,
                 int64_t co0) {
  using Vec = typename Lanes<F, B>::Vec;
  constexpr int V = B / Lanes<F, B>::kCount;
  const F* wb = wp + (co0 / B) * g.kh * g.kw * g.ci * B;
  for (int64_t r = row0; r < row1; ++r) {
    const int64_t n = r / g.ho, oy = r % g.ho;
    for (int64_t ox = 0; ox < g.wo; ++ox) {
      Vec a[V], b[V];  // two accumulators: independent add chains
      for (int q = 0; q < V; ++q) a[q] = b[q] = Vec{};
      for (int64_t i = 0; i < g.kh; ++i) {
        const int64_t iy = oy * g.sh - g.ph + i;
        if (iy < 0 || iy >= g.h) continue;
        for (int64_t j = 0; j < g.kw; ++j) {
          const int64_t ix = ox * g.sw - g.pw + j;
          if (ix < 0 || ix >= g.w) continue;
          const int64_t pos = (n * g.h + iy) * g.w + ix;
          SumRows<F, B>(wb + (i * g.kw + j) * g.ci * B, B, nz.channel.data(), nz.value.data(), nz.start[pos],
                        nz.start[pos + 1], a, b);
        }
      }
      StoreSum<F, B>(y + (r * g.wo + ox) * g.co + co0, a, b);
    }
  }
}

// The kernel gradient's view of x. Its output gradient is read in a padded layout: images of `rows` x `cols`
// positions, the output's ho x wo with `top` rows and `left` columns of zeros before and enough after for every
// tap, so that no tap needs a bounds check. Tap (i, j) reads only x's rows i - ph and columns j - pw modulo the
// strides (a phase), and moves phase position (m, mx) of image n to padded position
// (n * rows + m) * cols + mx + shift[i * kw + j].
struct Padded {
  int64_t top, left, rows, cols, phase_rows;
  std::vector<int64_t> dy, shift;  // [kh * kw]: output row of phase row 0; the shift above

  explicit Padded(const Geometry& g) : phase_rows(CeilDiv(g.h, g.sh)), dy(g.kh * g.kw), shift(g.kh * g.kw) {
    int64_t y0 = 0, y1 = g.ho - 1, x0 = 0, x1 = g.wo - 1;  // the output rows / columns any tap reaches
    for (int64_t i = 0; i < g.kh; ++i) {
      y0 = std::min(y0, Shift(i, g.ph, g.sh));
      y1 = std::max(y1, Shift(i, g.ph, g.sh) + CeilDiv(g.h - Mod(i - g.ph, g.sh), g.sh) - 1);
    }
    for (int64_t j = 0; j < g.kw; ++j) {
      x0 = std::min(x0, Shift(j, g.pw, g.sw));
      x1 = std::max(x1, Shift(j, g.pw, g.sw) + CeilDiv(g.w - Mod(j - g.pw, g.sw), g.sw) - 1);
    }
    top = -y0;
    left = -x0;
    rows = y1 - y0 + 1;
    cols = x1 - x0 + 1;
    for (int64_t i = 0; i < g.kh; ++i)
      for (int64_t j = 0; j < g.kw; ++j) {
        dy[i * g.kw + j] = Shift(i, g.ph, g.sh);
        shift[i * g.kw + j] = (top + Shift(i, g.ph, g.sh)) * cols + left + Shift(j, g.pw, g.sw);
      }
  }
  // The output row (column) that tap k moves index 0 of its phase to: exact, the phase is k - pad modulo stride.
  static int64_t Shift(int64_t k, int64_t pad, int64_t stride) { return (Mod(k - pad, stride) + pad - k) / stride; }
};

// x's nonzeros per (chunk of images, channel c, row phase rp, column phase cp, image n, phase row m), in column
// order: an entry holds its padded position without the tap's shift, (n * rows + m) * cols + mx, and its value.
// What one tap reads of a channel, over the images of a chunk or over rows of one image, is one contiguous run of
// entries, and a chunk's entries are together in memory.
template <typename F>
struct ChannelNonzeros {
  std::vector<int64_t> start;  // list (c, rp, cp, n, m) starts at start[Key(c, rp, cp, n, m)]
  std::vector<uint32_t> where;
  std::vector<F> value;
  int64_t ci, sh, sw, chunk, phase_rows;
  // From one channel's lists to the next within a chunk.
  int64_t Channel() const { return sh * sw * chunk * phase_rows; }
  int64_t Key(int64_t c, int64_t rp, int64_t cp, int64_t n, int64_t m) const {
    return ((((n / chunk * ci + c) * sh + rp) * sw + cp) * chunk + n % chunk) * phase_rows + m;
  }
};

template <typename F>
void ListChannelNonzeros(ffi::ThreadPool& pool, const F* x, const Geometry& g, const Padded& pad,
                         int64_t chunk, ChannelNonzeros<F>& nz) {
  nz.ci = g.ci;
  nz.sh = g.sh;
  nz.sw = g.sw;
  nz.chunk = chunk;
  nz.phase_rows = pad.phase_rows;
  const int64_t lists = CeilDiv(g.n, chunk) * g.ci * nz.Channel();
  nz.start.assign(lists + 1, 0);
  // Each image's lists are one worker's, counted and then filled through a table of the image's own laid out
  // [rp, cp, m, c]: channels innermost, where one position's lists lie a channel's stride apart.
  const int64_t phases = g.sh * g.sw, table_size = phases * pad.phase_rows * g.ci;
  auto table_row = [&](int64_t iy, int64_t ix) {
    return (((iy % g.sh) * g.sw + ix % g.sw) * pad.phase_rows + iy / g.sh) * g.ci;
  };
  auto each_list = [&](int64_t n, auto fn) {  // fn(list key, table index)
    const int64_t first = nz.Key(0, 0, 0, n, 0), phase_stride = nz.Key(0, 0, 1, 0, 0);  // (rp, cp) -> (rp, cp + 1)
    for (int64_t c = 0; c < g.ci; ++c)
      for (int64_t phase = 0; phase < phases; ++phase)
        for (int64_t m = 0; m < pad.phase_rows; ++m)
          fn(first + (c * phases + phase) * phase_stride + m, (phase * pad.phase_rows + m) * g.ci + c);
  };
  ParallelChunks<F>(pool, g.n, 1, [&](int64_t n, F*) {
    std::vector<int64_t> count(table_size, 0);
    for (int64_t iy = 0; iy < g.h; ++iy)
      for (int64_t ix = 0; ix < g.w; ++ix) {
        int64_t* row = count.data() + table_row(iy, ix);
        const F* xp = x + ((n * g.h + iy) * g.w + ix) * g.ci;
        for (int64_t c = 0; c < g.ci; ++c) row[c] += xp[c] != F(0);
      }
    each_list(n, [&](int64_t key, int64_t at) { nz.start[key + 1] = count[at]; });
  });
  for (int64_t k = 0; k < lists; ++k) nz.start[k + 1] += nz.start[k];
  nz.where.resize(nz.start[lists]);
  nz.value.resize(nz.start[lists]);
  ParallelChunks<F>(pool, g.n, 1, [&](int64_t n, F*) {
    std::vector<int64_t> next(table_size);  // each list's next entry
    each_list(n, [&](int64_t key, int64_t at) { next[at] = nz.start[key]; });
    for (int64_t iy = 0; iy < g.h; ++iy)
      for (int64_t ix = 0; ix < g.w; ++ix) {
        const uint32_t at = static_cast<uint32_t>((n * pad.rows + iy / g.sh) * pad.cols + ix / g.sw);
        int64_t* cursor = next.data() + table_row(iy, ix);
        const F* xp = x + ((n * g.h + iy) * g.w + ix) * g.ci;
        for (int64_t c = 0; c < g.ci; ++c) {
          if (xp[c] != F(0)) {
            const int64_t k = cursor[c]++;
            nz.where[k] = at;
            nz.value[k] = xp[c];
          }
        }
      }
  });
}

// A pass of the kernel gradient: output rows [o0, o1) of images [n0, n1) (within one chunk of the lists), whose
// padded rows from `first` on (counted from image 0) sit in the pass's buffer: either whole images (o0 = 0,
// o1 = ho, their padding rows included: `band` false) or a band of rows of one image, without padding rows.
struct Pass {
  int64_t n0, n1, o0, o1, first;
  bool band;
};

// Adds the pass's contribution to d [Ci, kh, kw, B], from gp: its output gradient for one block of B channels,
// [rows of the pass, cols, B] (zero outside the output).
template <typename F, int B>
void WeightGradPass(const Geometry& g, const Padded& pad, const ChannelNonzeros<F>& nz, const Pass& pass,
                    const F* gp, F* d) {
  using Vec = typename Lanes<F, B>::Vec;
  constexpr int L = Lanes<F, B>::kCount, V = B / L;
  const int64_t taps = g.kh * g.kw, channel = nz.Channel();
  std::vector<int64_t> k0(taps), k1(taps);  // each tap's run of entries, in channel 0's lists
  for (int64_t i = 0; i < g.kh; ++i)
    for (int64_t j = 0; j < g.kw; ++j) {
      const int64_t t = i * g.kw + j, rp = Mod(i - g.ph, g.sh), cp = Mod(j - g.pw, g.sw);
      // a band: the phase rows m that reach its output rows, m + dy in [o0, o1); whole images: every row (those
      // the tap moves outside the output read padding)
      const int64_t rows = CeilDiv(g.h - rp, g.sh);
      const int64_t m0 = pass.band ? std::clamp<int64_t>(pass.o0 - pad.dy[t], 0, rows) : 0;
      const int64_t m1 = pass.band ? std::clamp<int64_t>(pass.o1 - pad.dy[t], m0, rows) : rows;
      k0[t] = nz.Key(0, rp, cp, pass.n0, m0);
      k1[t] = nz.Key(0, rp, cp, pass.n1 - 1, m1);
    }
  for (int64_t c = 0; c < g.ci; ++c)
    for (int64_t t = 0; t < taps; ++t) {
      const int64_t begin = nz.start[c * channel + k0[t]], end = nz.start[c * channel + k1[t]];  // runs of one chunk
      if (begin == end) continue;
      Vec a[V], e[V];  // two accumulators: independent add chains
      for (int q = 0; q < V; ++q) a[q] = e[q] = Vec{};
      SumRows<F, B>(gp + (pad.shift[t] - pass.first * pad.cols) * B, B, nz.where.data(), nz.value.data(), begin, end,
                    a, e);
      F* dc = d + (c * taps + t) * B;
#pragma GCC unroll 16
      for (int q = 0; q < V; ++q) {
        const Vec sum = Load<F, B>(dc + q * L) + a[q] + e[q];
        __builtin_memcpy(dc + q * L, &sum, sizeof(sum));
      }
    }
}

Geometry MakeGeometry(ffi::Span<const int64_t> x, ffi::Span<const int64_t> w, ffi::Span<const int64_t> y,
                      int64_t sh, int64_t sw, int64_t ph, int64_t pw) {
  return {x[0], x[1], x[2], x[3], w[0], w[1], w[3], y[1], y[2], sh, sw, ph, pw};
}

// Channels per block: the widest of `widest`, 32, 16, 8 that divides co.
template <typename F, template <typename, int> class Item, int widest, typename... Args>
void Dispatch(int64_t co, Args&&... args) {
  if (widest >= 64 && co % 64 == 0) {
    Item<F, 64>::Run(args...);
  } else if (widest >= 32 && co % 32 == 0) {
    Item<F, 32>::Run(args...);
  } else if (widest >= 16 && co % 16 == 0) {
    Item<F, 16>::Run(args...);
  } else {
    Item<F, 8>::Run(args...);
  }
}

template <typename F, int B>
struct ForwardAll {
  static void Run(ffi::ThreadPool& pool, const Geometry& g, const PositionNonzeros<F>& nz, const F* w, F* y) {
    const int64_t rows = g.n * g.ho, blocks = g.co / B, taps_ci = g.kh * g.kw * g.ci;
    std::vector<F> packed(taps_ci * g.co);  // [blocks, kh, kw, Ci, B]: a block's kernel is contiguous
    for (int64_t t = 0; t < taps_ci; ++t)
      for (int64_t blk = 0; blk < blocks; ++blk)
        std::copy(w + t * g.co + blk * B, w + t * g.co + blk * B + B, packed.data() + (blk * taps_ci + t) * B);
    w = packed.data();
    const int64_t rows_per_item = std::max<int64_t>(1, std::min<int64_t>(16, rows / 8));
    const int64_t row_items = (rows + rows_per_item - 1) / rows_per_item;
    ParallelChunks<F>(pool, row_items * blocks, 1, [&](int64_t item, F*) {
      const int64_t block = item / row_items, r0 = (item % row_items) * rows_per_item;
      ForwardItem<F, B>(g, nz, w, y, r0, std::min(rows, r0 + rows_per_item), block * B);
    });
  }
};

// Scratch is allocated kAlign values longer than it needs and used from its first 64-byte boundary: a block's
// vectors then never straddle two cache lines.
constexpr int64_t kAlign = 64;
template <typename F>
F* Aligned(F* p) {
  return reinterpret_cast<F*>((reinterpret_cast<uintptr_t>(p) + 63) & ~uintptr_t(63));
}

template <typename F, int B>
struct WeightGradAll {
  static void Run(ffi::ThreadPool& pool, const Geometry& g, const Padded& pad, const F* x, const F* gy, F* dw) {
    const int64_t blocks = g.co / B, taps = g.kh * g.kw, per_block = g.ci * taps * B;
    // Passes whose output gradient stays in cache while every channel and tap reads it: an image's band of rows
    // in L1 where a padded image is larger, else whole images in L2 (longer runs of entries).
    constexpr int64_t kBandBytes = 20 << 10, kImagesBytes = 256 << 10;
    const int64_t row_bytes = pad.cols * B * int64_t(sizeof(F)), image_bytes = pad.rows * row_bytes;
    const bool bands = image_bytes > 32 << 10;
    const int64_t band = std::clamp<int64_t>(kBandBytes / row_bytes, 1, g.ho);
    const int64_t images = std::clamp<int64_t>(kImagesBytes / image_bytes, 1, g.n);
    const int64_t buffer = bands ? band * pad.cols * B : images * pad.rows * pad.cols * B;
    const int64_t chunk = bands ? 1 : images, chunks = CeilDiv(g.n, chunk);
    ChannelNonzeros<F> nz;
    ListChannelNonzeros(pool, x, g, pad, chunk, nz);
    // chunks split into groups where there are few blocks, each group its own partial sums
    const int64_t groups = std::clamp<int64_t>(CeilDiv(4 * pool.num_threads(), blocks), 1, chunks);
    std::vector<F> partial(groups * blocks * per_block, F(0));  // [groups, blocks, Ci, kh, kw, B]
    ParallelChunks<F>(pool, blocks * groups, buffer + kAlign, [&](int64_t item, F* scratch) {
      F* gp = Aligned(scratch);
      const int64_t blk = item / groups, grp = item % groups, co0 = blk * B;
      F* d = partial.data() + (grp * blocks + blk) * per_block;
      std::fill(gp, gp + buffer, F(0));  // what the copies below never write stays zero
      auto run = [&](const Pass& pass) {
        for (int64_t n = pass.n0; n < pass.n1; ++n)
          for (int64_t oy = pass.o0; oy < pass.o1; ++oy)
            for (int64_t ox = 0; ox < g.wo; ++ox)
              std::copy_n(gy + ((n * g.ho + oy) * g.wo + ox) * g.co + co0, B,
                          gp + ((n * pad.rows + pad.top + oy - pass.first) * pad.cols + pad.left + ox) * B);
        WeightGradPass<F, B>(g, pad, nz, pass, gp, d);
      };
      for (int64_t k = chunks * grp / groups; k < chunks * (grp + 1) / groups; ++k) {
        const int64_t n0 = k * chunk, n1 = std::min(g.n, n0 + chunk);
        if (!bands) {
          run({n0, n1, 0, g.ho, n0 * pad.rows, false});
          continue;
        }
        for (int64_t o0 = 0; o0 < g.ho; o0 += band) {
          const int64_t o1 = std::min(g.ho, o0 + band);
          run({n0, n1, o0, o1, n0 * pad.rows + pad.top + o0, true});
        }
      }
    });
    ParallelChunks<F>(pool, g.ci, 1, [&](int64_t c, F*) {
      for (int64_t t = 0; t < taps; ++t)
        for (int64_t blk = 0; blk < blocks; ++blk) {
          F* out = dw + (t * g.ci + c) * g.co + blk * B;
          const F* src = partial.data() + (blk * g.ci + c) * taps * B + t * B;
          std::copy_n(src, B, out);
          for (int64_t grp = 1; grp < groups; ++grp)
            for (int q = 0; q < B; ++q) out[q] += src[grp * blocks * per_block + q];
        }
    });
  }
};

// The sparse-input matmul, a linear layer on spikes: x [rows, ci] times w [ci, co]. Both its kernels sum lists of
// x's nonzeros: out[l, block] = sum of v * rows[i, block] over list l's entries (i, v), a block of B columns in
// registers, read straight from `rows` (co wide: a block of one of its rows is contiguous). The forward's lists are
// x's rows (PositionNonzeros, a row per position) over w's rows; the kernel gradient's are x's columns
// (ColumnNonzeros) over g's rows. Work items own a block and a run of lists; consecutive items share a block, whose
// column of `rows` stays in cache.
template <typename F, int B>
struct SumListsAll {
  template <typename I>
  static void Run(ffi::ThreadPool& pool, int64_t lists, int64_t co, const int64_t* start, const I* index,
                  const F* value, const F* rows, F* out) {
    using Vec = typename Lanes<F, B>::Vec;
    constexpr int V = B / Lanes<F, B>::kCount;
    const int64_t per_item = std::clamp<int64_t>(lists / 8, 1, 32), list_items = CeilDiv(lists, per_item);
    ParallelChunks<F>(pool, list_items * (co / B), 1, [&](int64_t item, F*) {
      const int64_t co0 = item / list_items * B, l0 = item % list_items * per_item;
      for (int64_t l = l0; l < std::min(lists, l0 + per_item); ++l) {
        Vec a[V], b[V];
        for (int q = 0; q < V; ++q) a[q] = b[q] = Vec{};
        SumRows<F, B>(rows + co0, co, index, value, start[l], start[l + 1], a, b);
        StoreSum<F, B>(out + l * co + co0, a, b);
      }
    });
  }
};

// The kernel gradient's view of x [rows, ci]: its nonzeros per column, in row order: start [ci + 1], row, value.
template <typename F>
struct ColumnNonzeros {
  std::vector<int64_t> start;
  std::vector<int32_t> row;
  std::vector<F> value;
};

// Ranges of rows, each counted and then filled by one worker through its own cursors (its part of every list).
template <typename F>
void ListColumnNonzeros(ffi::ThreadPool& pool, const F* x, int64_t rows, int64_t ci, ColumnNonzeros<F>& nz) {
  const int64_t ranges = std::clamp<int64_t>(rows / kRowsPerItem, 1, 4 * pool.num_threads());
  std::vector<int64_t> cursor(ranges * ci, 0);  // [range, c]: its count, then where its next entry goes
  auto each_row = [&](int64_t range, auto fn) {
    for (int64_t r = rows * range / ranges; r < rows * (range + 1) / ranges; ++r) fn(r, x + r * ci);
  };
  ParallelChunks<F>(pool, ranges, 1, [&](int64_t range, F*) {
    int64_t* count = cursor.data() + range * ci;
    each_row(range, [&](int64_t, const F* xr) {
      for (int64_t c = 0; c < ci; ++c) count[c] += xr[c] != F(0);
    });
  });
  nz.start.assign(ci + 1, 0);
  for (int64_t c = 0, total = 0; c < ci; ++c) {
    for (int64_t range = 0; range < ranges; ++range) {
      const int64_t count = cursor[range * ci + c];
      cursor[range * ci + c] = total;
      total += count;
    }
    nz.start[c + 1] = total;
  }
  nz.row.resize(nz.start[ci]);
  nz.value.resize(nz.start[ci]);
  ParallelChunks<F>(pool, ranges, 1, [&](int64_t range, F*) {
    int64_t* next = cursor.data() + range * ci;
    each_row(range, [&](int64_t r, const F* xr) {
      for (int64_t c = 0; c < ci; ++c) {
        if (xr[c] != F(0)) {
          const int64_t k = next[c]++;
          nz.row[k] = static_cast<int32_t>(r);
          nz.value[k] = xr[c];
        }
      }
    });
  });
}

template <ffi::DataType DT>
ffi::Error Forward(ffi::ThreadPool pool, ffi::Buffer<DT> x, ffi::Buffer<DT> w, ffi::ResultBuffer<DT> y,
                   int64_t sh, int64_t sw, int64_t ph, int64_t pw) {
  using F = ffi::NativeType<DT>;
  const Geometry g = MakeGeometry(x.dimensions(), w.dimensions(), y->dimensions(), sh, sw, ph, pw);
  if (g.co % 8) return ffi::Error::InvalidArgument("sparse conv: output channels must divide by 8");
  PositionNonzeros<F> nz;
  ListPositionNonzeros(pool, x.typed_data(), g.n * g.h * g.w, g.ci, nz);
  Dispatch<F, ForwardAll, 64>(g.co, pool, g, nz, w.typed_data(), y->typed_data());
  return ffi::Error::Success();
}

template <ffi::DataType DT>
ffi::Error WeightGrad(ffi::ThreadPool pool, ffi::Buffer<DT> x, ffi::Buffer<DT> gy, ffi::ResultBuffer<DT> dw,
                      int64_t sh, int64_t sw, int64_t ph, int64_t pw) {
  using F = ffi::NativeType<DT>;
  const Geometry g = MakeGeometry(x.dimensions(), dw->dimensions(), gy.dimensions(), sh, sw, ph, pw);
  if (g.co % 8) return ffi::Error::InvalidArgument("sparse conv: output channels must divide by 8");
  const Padded pad(g);
  if (g.n * pad.rows * pad.cols >= (int64_t(1) << 32))
    return ffi::Error::InvalidArgument("sparse conv: more than 2^32 padded positions");
  Dispatch<F, WeightGradAll, 128 / sizeof(F)>(g.co, pool, g, pad, x.typed_data(), gy.typed_data(), dw->typed_data());
  return ffi::Error::Success();
}

template <ffi::DataType DT>
ffi::Error Matmul(ffi::ThreadPool pool, ffi::Buffer<DT> x, ffi::Buffer<DT> w, ffi::ResultBuffer<DT> y) {
  using F = ffi::NativeType<DT>;
  const int64_t rows = x.dimensions()[0], ci = x.dimensions()[1], co = w.dimensions()[1];
  if (co % 8) return ffi::Error::InvalidArgument("sparse matmul: output columns must divide by 8");
  PositionNonzeros<F> nz;
  ListPositionNonzeros(pool, x.typed_data(), rows, ci, nz);
  Dispatch<F, SumListsAll, 64>(co, pool, rows, co, nz.start.data(), nz.channel.data(), nz.value.data(),
                               w.typed_data(), y->typed_data());
  return ffi::Error::Success();
}

template <ffi::DataType DT>
ffi::Error MatmulWeightGrad(ffi::ThreadPool pool, ffi::Buffer<DT> x, ffi::Buffer<DT> g, ffi::ResultBuffer<DT> dw) {
  using F = ffi::NativeType<DT>;
  const int64_t rows = x.dimensions()[0], ci = x.dimensions()[1], co = g.dimensions()[1];
  if (co % 8) return ffi::Error::InvalidArgument("sparse matmul: output columns must divide by 8");
  if (rows >= (int64_t(1) << 31)) return ffi::Error::InvalidArgument("sparse matmul: 2^31 rows or more");
  ColumnNonzeros<F> nz;
  ListColumnNonzeros(pool, x.typed_data(), rows, ci, nz);
  Dispatch<F, SumListsAll, 64>(co, pool, ci, co, nz.start.data(), nz.row.data(), nz.value.data(), g.typed_data(),
                               dw->typed_data());
  return ffi::Error::Success();
}

}  // namespace
}  // namespace snnjax

// Both handlers take (x, w or g) and return one buffer, with the same attributes.
#define SNN_SPARSE_CONV_HANDLER(NAME, FN, DT)                                                               \
  XLA_FFI_DEFINE_HANDLER_SYMBOL(NAME, FN<DT>,                                                               \
                                ffi::Ffi::Bind()                                                            \
                                    .Ctx<ffi::ThreadPool>()                                                 \
                                    .Arg<ffi::Buffer<DT>>()                                                 \
                                    .Arg<ffi::Buffer<DT>>()                                                 \
                                    .Ret<ffi::Buffer<DT>>()                                                 \
                                    .Attr<int64_t>("stride_h")                                              \
                                    .Attr<int64_t>("stride_w")                                              \
                                    .Attr<int64_t>("pad_h")                                                 \
                                    .Attr<int64_t>("pad_w"));

SNN_SPARSE_CONV_HANDLER(SnnSparseConvForwardF32, snnjax::Forward, ffi::F32)
SNN_SPARSE_CONV_HANDLER(SnnSparseConvForwardF64, snnjax::Forward, ffi::F64)
SNN_SPARSE_CONV_HANDLER(SnnSparseConvWeightGradF32, snnjax::WeightGrad, ffi::F32)
SNN_SPARSE_CONV_HANDLER(SnnSparseConvWeightGradF64, snnjax::WeightGrad, ffi::F64)
// The matmul's handlers take (x, w or g) and return one buffer.
#define SNN_SPARSE_MATMUL_HANDLER(NAME, FN, DT)                                                     \
  XLA_FFI_DEFINE_HANDLER_SYMBOL(                                                                    \
      NAME, FN<DT>,                                                                                 \
      ffi::Ffi::Bind().Ctx<ffi::ThreadPool>().Arg<ffi::Buffer<DT>>().Arg<ffi::Buffer<DT>>().Ret<ffi::Buffer<DT>>());

SNN_SPARSE_MATMUL_HANDLER(SnnSparseMatmulF32, snnjax::Matmul, ffi::F32)
SNN_SPARSE_MATMUL_HANDLER(SnnSparseMatmulF64, snnjax::Matmul, ffi::F64)
SNN_SPARSE_MATMUL_HANDLER(SnnSparseMatmulWeightGradF32, snnjax::MatmulWeightGrad, ffi::F32)
SNN_SPARSE_MATMUL_HANDLER(SnnSparseMatmulWeightGradF64, snnjax::MatmulWeightGrad, ffi::F64)
