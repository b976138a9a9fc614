// A 2-D convolution that skips the zeros of its input (spikes), for XLA:CPU through the FFI.
//
// SnnSparseConvForward{F32,F64}(x [N, H, W, Ci], w [kh, kw, Ci, Co]) -> y [N, Ho, Wo, Co]
// SnnSparseConvWeightGrad{F32,F64}(x [N, H, W, Ci], g [N, Ho, Wo, Co]) -> dw [kh, kw, Ci, Co]
// attributes: stride_h, stride_w, pad_h, pad_w (leading padding; the output shape sets the rest).
//
// Both list the nonzeros of x per input position first (CSR over the N*H*W positions), then
// - forward: every output position sums v * w[i, j, c, :] over the nonzeros (c, v) its window
//   reaches, in registers, a block of 64 output channels at a time (32, 16 or 8 where 64 does not
//   divide them), from the kernel repacked so that a block's rows are contiguous;
// - kernel gradient: dw[i, j, c, :] += v * g[p, :] for each output position p and each nonzero
//   (c, v) that tap (i, j) of p's window reaches; a work item owns one tap and one block of
//   output channels, so no two items write the same values.
// The work is proportional to the nonzeros: with spikes (10-20% ones) a fraction of a dense
// convolution's. Work items run on XLA's intra-op thread pool (parallel_chunks.h).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "parallel_chunks.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace snnjax {
namespace {

struct Geometry {
  int64_t n, h, w, ci, kh, kw, co, ho, wo, sh, sw, ph, pw;
};

// The nonzeros of x [positions, ci] per position: start [positions + 1], channel, value.
template <typename F>
struct Nonzeros {
  std::vector<int64_t> start;
  std::vector<int32_t> channel;
  std::vector<F> value;
};

constexpr int64_t kRowsPerItem = 64;

template <typename F>
void ListNonzeros(ffi::ThreadPool& pool, const F* x, int64_t positions, int64_t ci, Nonzeros<F>& nz) {
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

// Output rows (n, oy) [row0, row1), channels [co0, co0 + B); wp: w packed as [Co / B, kh, kw, Ci, B].
template <typename F, int B>
void ForwardItem(const Geometry& g, const Nonzeros<F>& nz, const F* wp, F* y, int64_t row0, int64_t row1,
                 int64_t co0) {
  using Vec = typename Lanes<F, B>::Vec;
  constexpr int L = Lanes<F, B>::kCount, V = B / L;
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
          const F* tap = wb + (i * g.kw + j) * g.ci * B;
          const int32_t* ch = nz.channel.data();
          const F* val = nz.value.data();
          int64_t k = nz.start[pos];
          const int64_t end = nz.start[pos + 1];
          for (; k + 1 < end; k += 2) {
            const F* w0 = tap + ch[k] * B;
            const F* w1 = tap + ch[k + 1] * B;
            const F v0 = val[k], v1 = val[k + 1];
#pragma GCC unroll 16
            for (int q = 0; q < V; ++q) {
              a[q] += v0 * Load<F, B>(w0 + q * L);
              b[q] += v1 * Load<F, B>(w1 + q * L);
            }
          }
          if (k < end) {
            const F* w0 = tap + ch[k] * B;
            const F v0 = val[k];
#pragma GCC unroll 16
            for (int q = 0; q < V; ++q) a[q] += v0 * Load<F, B>(w0 + q * L);
          }
        }
      }
      F* out = y + (r * g.wo + ox) * g.co + co0;
#pragma GCC unroll 16
      for (int q = 0; q < V; ++q) {
        const Vec sum = a[q] + b[q];
        __builtin_memcpy(out + q * L, &sum, sizeof(sum));
      }
    }
  }
}

// Tap (i, j) = divmod(tap, kw), channels [co0, co0 + B): d [Ci, B] (a contiguous block of the packed gradient).
template <typename F, int B>
void WeightGradItem(const Geometry& g, const Nonzeros<F>& nz, const F* gy, F* d, int64_t tap, int64_t co0) {
  using Vec = typename Lanes<F, B>::Vec;
  constexpr int L = Lanes<F, B>::kCount, V = B / L;
  const int64_t i = tap / g.kw, j = tap % g.kw;
  std::fill(d, d + g.ci * B, F(0));
  const int32_t* ch = nz.channel.data();
  const F* val = nz.value.data();
  for (int64_t n = 0; n < g.n; ++n) {
    for (int64_t oy = 0; oy < g.ho; ++oy) {
      const int64_t iy = oy * g.sh - g.ph + i;
      if (iy < 0 || iy >= g.h) continue;
      for (int64_t ox = 0; ox < g.wo; ++ox) {
        const int64_t ix = ox * g.sw - g.pw + j;
        if (ix < 0 || ix >= g.w) continue;
        const int64_t pos = (n * g.h + iy) * g.w + ix;
        const int64_t begin = nz.start[pos], end = nz.start[pos + 1];
        if (begin == end) continue;
        Vec row[V];
        const F* gp = gy + ((n * g.ho + oy) * g.wo + ox) * g.co + co0;
#pragma GCC unroll 16
        for (int q = 0; q < V; ++q) row[q] = Load<F, B>(gp + q * L);
        for (int64_t k = begin; k < end; ++k) {
          F* dc = d + ch[k] * B;
          const F v = val[k];
#pragma GCC unroll 16
          for (int q = 0; q < V; ++q) {
            const Vec sum = Load<F, B>(dc + q * L) + v * row[q];
            __builtin_memcpy(dc + q * L, &sum, sizeof(sum));
          }
        }
      }
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
  static void Run(ffi::ThreadPool& pool, const Geometry& g, const Nonzeros<F>& nz, const F* w, F* y) {
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

template <typename F, int B>
struct WeightGradAll {
  static void Run(ffi::ThreadPool& pool, const Geometry& g, const Nonzeros<F>& nz, const F* gy, F* dw) {
    const int64_t blocks = g.co / B, taps = g.kh * g.kw;
    std::vector<F> packed(taps * blocks * g.ci * B);  // [kh * kw, blocks, Ci, B]
    ParallelChunks<F>(pool, taps * blocks, 1, [&](int64_t item, F*) {
      WeightGradItem<F, B>(g, nz, gy, packed.data() + item * g.ci * B, item / blocks, (item % blocks) * B);
    });
    for (int64_t t = 0; t < taps; ++t)
      for (int64_t c = 0; c < g.ci; ++c)
        for (int64_t blk = 0; blk < blocks; ++blk) {
          const F* src = packed.data() + ((t * blocks + blk) * g.ci + c) * B;
          std::copy(src, src + B, dw + (t * g.ci + c) * g.co + blk * B);
        }
  }
};

template <ffi::DataType DT>
ffi::Error Forward(ffi::ThreadPool pool, ffi::Buffer<DT> x, ffi::Buffer<DT> w, ffi::ResultBuffer<DT> y,
                   int64_t sh, int64_t sw, int64_t ph, int64_t pw) {
  using F = ffi::NativeType<DT>;
  const Geometry g = MakeGeometry(x.dimensions(), w.dimensions(), y->dimensions(), sh, sw, ph, pw);
  if (g.co % 8) return ffi::Error::InvalidArgument("sparse conv: output channels must divide by 8");
  Nonzeros<F> nz;
  ListNonzeros(pool, x.typed_data(), g.n * g.h * g.w, g.ci, nz);
  Dispatch<F, ForwardAll, 64>(g.co, pool, g, nz, w.typed_data(), y->typed_data());
  return ffi::Error::Success();
}

template <ffi::DataType DT>
ffi::Error WeightGrad(ffi::ThreadPool pool, ffi::Buffer<DT> x, ffi::Buffer<DT> gy, ffi::ResultBuffer<DT> dw,
                      int64_t sh, int64_t sw, int64_t ph, int64_t pw) {
  using F = ffi::NativeType<DT>;
  const Geometry g = MakeGeometry(x.dimensions(), dw->dimensions(), gy.dimensions(), sh, sw, ph, pw);
  if (g.co % 8) return ffi::Error::InvalidArgument("sparse conv: output channels must divide by 8");
  Nonzeros<F> nz;
  ListNonzeros(pool, x.typed_data(), g.n * g.h * g.w, g.ci, nz);
  Dispatch<F, WeightGradAll, 64>(g.co, pool, g, nz, gy.typed_data(), dw->typed_data());
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
