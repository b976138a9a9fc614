// Fused multi-timestep IF / LIF / PLIF neuron kernels for the CPU (no XLA dependency).
//
// Data are time-major [T, M] (M = every neuron), row-major. A kernel call handles the
// neurons [lo, hi) of one chunk: its T loop keeps the chunk's membrane potential in a
// small array that stays in L1, and each inner loop runs over the chunk's neurons, so
// it vectorises. Bytes per neuron-step (F = float): forward 8 (read X, write S), backward
// 12 (read X and dS, write dX; H is recomputed into a per-chunk scratch that stays in
// cache). The forward rounds as the XLA path compiled for the same CPU does
// (snnjax/neurons/base.py), so the spikes and states are the same bits.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#if defined(__AVX__)
#include <immintrin.h>
#endif

namespace snnjax {

// [T, M] outputs at least this large cannot stay in cache until their consumer reads them,
// so the kernels write them with non-temporal stores (x86 with AVX): a line written that way
// skips the read for ownership that a plain store costs, a third of a copy's memory traffic.
inline constexpr int64_t kStreamMinBytes = int64_t{8} << 20;
#if defined(__AVX__)
inline constexpr bool kCanStream = true;
#else
inline constexpr bool kCanStream = false;
#endif

#if defined(__AVX__)
inline void StreamBlock(float* dst, const float* src) { _mm256_stream_ps(dst, _mm256_loadu_ps(src)); }
inline void StreamBlock(double* dst, const double* src) { _mm256_stream_pd(dst, _mm256_loadu_pd(src)); }
#endif

// dst[0, n) = src[0, n), aligned 32-byte blocks with non-temporal stores where kCanStream.
// The stores are weakly ordered: StreamFence() before another thread may read dst.
template <typename F>
inline void StreamStore(F* dst, const F* src, int64_t n) {
#if defined(__AVX__)
  constexpr int64_t kLanes = 32 / sizeof(F);
  int64_t i = 0;
  for (; i < n && (reinterpret_cast<uintptr_t>(dst + i) & 31) != 0; ++i) dst[i] = src[i];
  for (; i + kLanes <= n; i += kLanes) StreamBlock(dst + i, src + i);
  for (; i < n; ++i) dst[i] = src[i];
#else
  std::memcpy(dst, src, n * sizeof(F));
#endif
}
inline void StreamFence() {
#if defined(__AVX__)
  _mm_sfence();
#endif
}

// How H is charged from V and X; each is one template instance, so the loops are branch-free.
enum Charging : int {
  kIntegrate = 0,   // IF: H = V + X
  kDecayInput = 1,  // LIF / PLIF, decay_input: H = V + (X - (V - v_r)) k
  kKeep = 2,        // LIF / PLIF, no decay_input, v_r = 0: H = V keep + X
  kLeak = 3,        // LIF / PLIF, no decay_input, v_r != 0: H = V - (V - v_r) k + X
};
enum Surrogate : int { kSigmoid = 0, kATan = 1, kPiecewiseQuadratic = 2, kSoftSign = 3, kRect = 4 };

template <typename F>
struct Params {
  int64_t T, M;
  F v_th, v_reset;  // v_reset: the hard-reset potential (v_r), 0 for soft reset
  F k, keep;        // 1/tau (LIF: 1 / F(tau); PLIF: sigmoid(w)) and 1 - k (LIF: F(1 - 1/tau))
  F alpha;          // the surrogate's sharpness
  F half_width;     // Rect's window 0.5 / alpha, divided in double then rounded (as the XLA path's constant)
  bool hard, detach, v_seq, decay_input;
  bool stream;      // write the [T, M] outputs through StreamStore
};

// a * b + c rounded as XLA's CPU backend rounds it: LLVM contracts a multiply feeding an
// add into one fused multiply-add wherever the target has the instruction.
template <typename F>
inline F MulAdd(F a, F b, F c) {
#if defined(__FMA__) || defined(__aarch64__)
  return std::fma(a, b, c);
#else
  return a * b + c;
#endif
}

// H in the XLA path's rounding: its d / tau is d * (1 / tau) (XLA rewrites a division by a
// constant as a multiplication by the reciprocal), contracted as MulAdd. With v_r = 0,
// X - (V - 0) is X - V exactly, so kDecayInput covers both reset potentials.
template <typename F, int CHARGING>
inline F Charge(F v, F x, F k, F keep, F vr) {
  if constexpr (CHARGING == kIntegrate) return v + x;
  else if constexpr (CHARGING == kDecayInput) return MulAdd(x - (v - vr), k, v);
  else if constexpr (CHARGING == kKeep) return MulAdd(v, keep, x);
  else return MulAdd(-(v - vr), k, v) + x;
}

// V after the spike s in {0, 1}: hard (1 - s) H + s v_r, soft H - s v_threshold.
template <typename F, bool HARD>
inline F Reset(F h, F s, F vr, F vth) {
  if constexpr (HARD) return (F(1) - s) * h + s * vr;
  else return h - s * vth;
}

// exp(-a x) for x >= 0 in float, in a form that vectorises: 2^z with z = -a log2(e) x split
// into n = round(z) and r = z - n in [-1/2, 1/2]. 2^r is a degree-5 minimax polynomial
// (relative error 9e-8) in Estrin's form: Horner's chain of dependent FMAs made the
// backward latency-bound. z + (1.5 * 2^23 + 127) rounds to an integer whose low mantissa
// bits are n + 127; shifted left by 23 they are the exponent field of 2^n. x is clamped so
// that z >= -125 (2^n a normal float) as integer bits, which for x >= 0 order as the floats
// do: GCC makes that one vpminsd, where a float clamp turns into compares and blends.
inline float ExpNegAbs(float a, float x) {
  const float c = a * 1.44269504088896341f;
  const int32_t xb = __builtin_bit_cast(int32_t, x), lim = __builtin_bit_cast(int32_t, 125.0f / c);
  const float z = -c * __builtin_bit_cast(float, xb < lim ? xb : lim);
  const float t = z + 12583039.0f;
  const float r = z - (t - 12583039.0f);
  const float r2 = r * r, r4 = r2 * r2;
  const float p01 = __builtin_fmaf(6.931470036506653e-1f, r, 1.0f);
  const float p23 = __builtin_fmaf(5.550733953714371e-2f, r, 2.4022242426872253e-1f);
  const float p45 = __builtin_fmaf(1.3264698209241033e-3f, r, 9.671509265899658e-3f);
  const float y = __builtin_fmaf(p45, r4, __builtin_fmaf(p23, r2, p01));
  return y * __builtin_bit_cast(float, __builtin_bit_cast(int32_t, t) << 23);
}
inline double ExpNegAbs(double a, double x) { return std::exp(-(a * x)); }

// The surrogate derivative sg'(x) at x = H - v_threshold (formulas of surrogate.py); hw is Rect's half-width.
template <typename F, int SURR>
inline F SurrogateGrad(F x, F a, F hw) {
  if constexpr (SURR == kSigmoid) {
    // sigmoid(a x) (1 - sigmoid(a x)) = e / (1 + e)^2 with e = exp(-a |x|) in (0, 1]: the
    // derivative is even in x, and 1 + e cannot overflow.
    const F e = ExpNegAbs(a, std::fabs(x)), d = F(1) + e;
    return a * e / (d * d);
  } else if constexpr (SURR == kATan) {
    const F z = static_cast<F>(M_PI / 2.0) * a * x;
    return a / F(2) / (F(1) + z * z);
  } else if constexpr (SURR == kPiecewiseQuadratic) {
    const F ax = x < F(0) ? -x : x;
    return ax > F(1) / a ? F(0) : a - a * a * ax;
  } else if constexpr (SURR == kSoftSign) {
    const F d = F(1) / a + (x < F(0) ? -x : x);
    return F(1) / (F(2) * a * d * d);
  } else {
    return (x < F(0) ? -x : x) < hw ? a : F(0);  // strictly inside the window, as SpikingJelly's Rect
  }
}

// Neurons [lo, hi) forward. v0 has v0_size = M entries, or 1 (the same start for every neuron).
// v_out is [T, M] when p.v_seq, else [M] (the final state). v, row: [hi - lo] scratch.
template <typename F, int CHARGING, bool HARD>
void ForwardChunk(const Params<F>& p, int64_t lo, int64_t hi, const F* x, const F* v0, int64_t v0_size, F* s,
                  F* v_out, F* v, F* row) {
  const int64_t n = hi - lo, M = p.M, T = p.T;
  const F k = p.k, keep = p.keep, vr = p.v_reset, vth = p.v_th;
  const bool v_seq = p.v_seq;
  for (int64_t i = 0; i < n; ++i) v[i] = v0[v0_size == 1 ? 0 : lo + i];
  for (int64_t t = 0; t < T; ++t) {
    const F* __restrict xt = x + t * M + lo;
    F* __restrict st = p.stream ? row : s + t * M + lo;
    F* __restrict vc = v;
#pragma GCC ivdep
    for (int64_t i = 0; i < n; ++i) {
      const F h = Charge<F, CHARGING>(vc[i], xt[i], k, keep, vr);
      const F spike = h >= vth ? F(1) : F(0);
      st[i] = spike;
      vc[i] = Reset<F, HARD>(h, spike, vr, vth);
    }
    if (p.stream) StreamStore(s + t * M + lo, row, n);
    if (v_seq && p.stream) StreamStore(v_out + t * M + lo, v, n);
    else if (v_seq) std::memcpy(v_out + t * M + lo, v, n * sizeof(F));
  }
  if (!v_seq) std::memcpy(v_out + lo, v, n * sizeof(F));
  if (p.stream) StreamFence();
}

// The backward's first half for neurons [lo, hi): H for every step into h ([T, hi - lo]),
// bit for bit the H of the forward. v: [hi - lo] scratch.
template <typename F, int CHARGING, bool HARD>
void RecomputeChunk(const Params<F>& p, int64_t lo, int64_t hi, const F* x, const F* v0, int64_t v0_size, F* h,
                    F* v) {
  const int64_t n = hi - lo, M = p.M, T = p.T;
  const F k = p.k, keep = p.keep, vr = p.v_reset, vth = p.v_th;
  for (int64_t i = 0; i < n; ++i) v[i] = v0[v0_size == 1 ? 0 : lo + i];
  for (int64_t t = 0; t < T; ++t) {
    const F* __restrict xt = x + t * M + lo;
    F* __restrict ht = h + t * n;
    F* __restrict vc = v;
#pragma GCC ivdep
    for (int64_t i = 0; i < n; ++i) {
      const F hv = Charge<F, CHARGING>(vc[i], xt[i], k, keep, vr);
      ht[i] = hv;
      vc[i] = Reset<F, HARD>(hv, hv >= vth ? F(1) : F(0), vr, vth);
    }
  }
}

// The backward's second half for neurons [lo, hi): the reverse recurrence over the H of
// RecomputeChunk. ds: [T, M]; dv_out: [T, M] (p.v_seq), [M] (the final state's cotangent)
// or nullptr (a zero cotangent); dx: [T, M]; dv0: [M] or nullptr (not wanted). dv, dh, g,
// row: [hi - lo] scratch. Returns the chunk's sum over neurons and steps of dL/dH_t dH_t/dk
// when PLIF (its decay's gradient), else 0.
template <typename F, int SURR, bool PLIF>
F ReverseChunk(const Params<F>& p, int64_t lo, int64_t hi, const F* x, const F* v0, int64_t v0_size, const F* h,
               const F* ds, const F* dv_out, F* dx, F* dv0, F* dv, F* dh, F* g, F* row) {
  const int64_t n = hi - lo, M = p.M, T = p.T;
  const F vr = p.v_reset, vth = p.v_th, alpha = p.alpha, hw = p.half_width, k = p.k;
  const bool hard = p.hard, v_seq = p.v_seq, decay_input = p.decay_input;
  // dV_t/dH_t = g (a (v_r - H) - c v_th) + 1 - b S, the flags as 0/1 coefficients (hard and
  // not detached: (v_r - H) g + 1 - S; hard, detached: 1 - S; soft, not detached:
  // 1 - v_th g; soft, detached: 1). A zero coefficient adds an exact zero.
  const F ca = hard && !p.detach ? F(1) : F(0), cb = hard ? F(1) : F(0);
  const F cc_vth = !hard && !p.detach ? vth : F(0);
  const F carry = p.keep;                       // dH_{t+1}/dV_t (1 for IF)
  const F dx_scale = decay_input ? k : F(1);    // dH_t/dX_t (1 for IF)
  for (int64_t i = 0; i < n; ++i) dv[i] = (dv_out == nullptr || v_seq) ? F(0) : dv_out[lo + i];
  F dk = F(0);
  for (int64_t t = T - 1; t >= 0; --t) {
    const F* __restrict ht = h + t * n;
    const F* __restrict dst = ds + t * M + lo;
    F* __restrict dxt = p.stream ? row : dx + t * M + lo;
    F* __restrict dvc = dv;
    F* __restrict dhc = dh;
    if (v_seq && dv_out != nullptr)
      for (int64_t i = 0; i < n; ++i) dv[i] += dv_out[t * M + lo + i];
    // The surrogate in a loop of its own: a short loop body lets the core overlap more
    // iterations of its long dependency chains (1.3x faster backward with Sigmoid).
    F* __restrict gc = g;
#pragma GCC ivdep
    for (int64_t i = 0; i < n; ++i) gc[i] = SurrogateGrad<F, SURR>(ht[i] - vth, alpha, hw);
#pragma GCC ivdep
    for (int64_t i = 0; i < n; ++i) {
      const F hv = ht[i], gi = gc[i];
      const F dv_dh = MulAdd(gi, ca * (vr - hv) - cc_vth, hv >= vth ? F(1) - cb : F(1));
      const F d = MulAdd(dst[i], gi, dvc[i] * dv_dh);
      dxt[i] = d * dx_scale;
      dvc[i] = d * carry;
      if constexpr (PLIF) dhc[i] = d;
    }
    if (p.stream) StreamStore(dx + t * M + lo, row, n);
    if constexpr (PLIF) {
      // dH_t/dk = X_t - (V_{t-1} - v_r) with decay_input, else -(V_{t-1} - v_r); V_{t-1} is
      // V_init at t = 0, else the reset of H_{t-1}.
      const F* xt = x + t * M + lo;
      for (int64_t i = 0; i < n; ++i) {
        F vp;
        if (t == 0) {
          vp = v0[v0_size == 1 ? 0 : lo + i];
        } else {
          const F hp = ht[i - n], sp = hp >= vth ? F(1) : F(0);
          vp = hard ? Reset<F, true>(hp, sp, vr, vth) : Reset<F, false>(hp, sp, vr, vth);
        }
        dk += dh[i] * (decay_input ? xt[i] - (vp - vr) : -(vp - vr));
      }
    }
  }
  if (dv0 != nullptr) std::memcpy(dv0 + lo, dv, n * sizeof(F));
  if (p.stream) StreamFence();
  return dk;
}

}  // namespace snnjax
