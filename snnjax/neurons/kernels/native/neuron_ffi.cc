// XLA FFI handlers for the CPU neuron kernels of neuron_kernels.h.
//
// SnnNeuronForward{F32,F64}(x [T, M], v0 [M] or [], k []) -> (s [T, M], v [T, M] or [M])
// SnnNeuronBackward{F32,F64}(x, v0, k, ds [T, M], dv [T, M], [M] or [])
//     -> (dx [T, M], dv0 [M] or [], dk [chunks])
// A scalar v0 is the same start for every neuron (no dV_init is wanted: dv0 is a scalar,
// written 0); a scalar dv is a zero cotangent. Neurons are split into chunks of `chunk`
// (an attribute), run on XLA's intra-op thread pool; dk holds each chunk's PLIF partial sum.
//
// SnnStepForward{F32,F64}(x [T, M], s0 [S, M] or [S], p [P]) -> (out [T, M], v [T, M] or [1], last [S, M])
// SnnStepBackward{F32,F64}(x, s0, p, dout [T, M], dv [T, M] or [1] (a zero), dlast [S, M])
//     -> (dx [T, M], ds0 [S, M], dp [chunks, P])
// run a neuron given by its single step (S state variables, "v" first, P scalar parameters) through the
// chunk functions that snnjax.neurons.kernels.native.codegen generates from the step and registers under
// `key` (SnnStepRegister): the same chunks and thread pool as the built-in kernels.
#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <unordered_map>

#include "neuron_kernels.h"
#include "parallel_chunks.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace snnjax {
namespace {

// kind: 0 IF, 1 LIF, 2 PLIF. k is PLIF's sigmoid(w) in F; LIF's k and keep come from tau.
template <typename F>
Params<F> MakeParams(int64_t T, int64_t M, int64_t kind, F k, double tau, bool hard, bool detach, bool v_seq,
                     bool decay_input, double v_reset, double v_th, double alpha) {
  Params<F> p{T, M, static_cast<F>(v_th), static_cast<F>(v_reset), F(1), F(1), static_cast<F>(alpha),
              static_cast<F>(0.5 / alpha), hard, detach, v_seq, decay_input,
              kCanStream && T * M * int64_t{sizeof(F)} >= kStreamMinBytes};
  if (kind == 1) {
    p.k = F(1) / static_cast<F>(tau);
    p.keep = static_cast<F>(1.0 - 1.0 / tau);
  } else if (kind == 2) {
    p.k = k;
    p.keep = F(1) - k;
  }
  return p;
}

template <typename F>
using ForwardFn = void (*)(const Params<F>&, int64_t, int64_t, const F*, const F*, int64_t, F*, F*, F*, F*);
template <typename F>
using RecomputeFn = void (*)(const Params<F>&, int64_t, int64_t, const F*, const F*, int64_t, F*, F*);
template <typename F>
using ReverseFn = F (*)(const Params<F>&, int64_t, int64_t, const F*, const F*, int64_t, const F*, const F*,
                        const F*, F*, F*, F*, F*, F*, F*);

template <typename F, bool HARD>
ForwardFn<F> PickForward(int64_t charging) {
  switch (charging) {
    case kIntegrate: return ForwardChunk<F, kIntegrate, HARD>;
    case kDecayInput: return ForwardChunk<F, kDecayInput, HARD>;
    case kKeep: return ForwardChunk<F, kKeep, HARD>;
    default: return ForwardChunk<F, kLeak, HARD>;
  }
}

template <typename F, bool HARD>
RecomputeFn<F> PickRecompute(int64_t charging) {
  switch (charging) {
    case kIntegrate: return RecomputeChunk<F, kIntegrate, HARD>;
    case kDecayInput: return RecomputeChunk<F, kDecayInput, HARD>;
    case kKeep: return RecomputeChunk<F, kKeep, HARD>;
    default: return RecomputeChunk<F, kLeak, HARD>;
  }
}

template <typename F, bool PLIF>
ReverseFn<F> PickReverse(int64_t surrogate) {
  switch (surrogate) {
    case kSigmoid: return ReverseChunk<F, kSigmoid, PLIF>;
    case kATan: return ReverseChunk<F, kATan, PLIF>;
    case kPiecewiseQuadratic: return ReverseChunk<F, kPiecewiseQuadratic, PLIF>;
    case kSoftSign: return ReverseChunk<F, kSoftSign, PLIF>;
    default: return ReverseChunk<F, kRect, PLIF>;
  }
}

ffi::Error CheckArgs(ffi::Span<const int64_t> x, int64_t chunk, int64_t charging, int64_t surrogate) {
  if (x.size() != 2) return ffi::Error::InvalidArgument("neuron kernels take x of shape [T, M]");
  if (chunk <= 0) return ffi::Error::InvalidArgument("chunk must be positive");
  if (charging < 0 || charging > kLeak) return ffi::Error::InvalidArgument("unknown charging mode");
  if (surrogate < 0 || surrogate > kRect) return ffi::Error::InvalidArgument("unknown surrogate");
  return ffi::Error::Success();
}

template <ffi::DataType DT>
ffi::Error Forward(ffi::ThreadPool pool, ffi::Buffer<DT> x, ffi::Buffer<DT> v0, ffi::Buffer<DT> k,
                   ffi::ResultBuffer<DT> s, ffi::ResultBuffer<DT> v, int64_t kind, int64_t charging, bool hard,
                   bool detach, bool v_seq, bool decay_input, double v_reset, double v_th, double tau, double alpha,
                   int64_t chunk) {
  using F = ffi::NativeType<DT>;
  if (ffi::Error e = CheckArgs(x.dimensions(), chunk, charging, 0); e.failure()) return e;
  const int64_t T = x.dimensions()[0], M = x.dimensions()[1];
  const Params<F> p = MakeParams<F>(T, M, kind, k.typed_data()[0], tau, hard, detach, v_seq, decay_input, v_reset,
                                    v_th, alpha);
  const ForwardFn<F> fn = hard ? PickForward<F, true>(charging) : PickForward<F, false>(charging);
  const F *xd = x.typed_data(), *v0d = v0.typed_data();
  const int64_t v0_size = v0.dimensions().size() == 0 ? 1 : M;
  F *sd = s->typed_data(), *vd = v->typed_data();
  ParallelChunks<F>(pool, (M + chunk - 1) / chunk, 2 * chunk, [=](int64_t c, F* scratch) {
    const int64_t lo = c * chunk;
    fn(p, lo, std::min(lo + chunk, M), xd, v0d, v0_size, sd, vd, scratch, scratch + chunk);
  });
  return ffi::Error::Success();
}

template <ffi::DataType DT>
ffi::Error Backward(ffi::ThreadPool pool, ffi::Buffer<DT> x, ffi::Buffer<DT> v0, ffi::Buffer<DT> k,
                    ffi::Buffer<DT> ds, ffi::Buffer<DT> dv, ffi::ResultBuffer<DT> dx, ffi::ResultBuffer<DT> dv0,
                    ffi::ResultBuffer<DT> dk, int64_t kind, int64_t charging, int64_t surrogate, bool hard,
                    bool detach, bool v_seq, bool decay_input, double v_reset, double v_th, double tau, double alpha,
                    int64_t chunk) {
  using F = ffi::NativeType<DT>;
  if (ffi::Error e = CheckArgs(x.dimensions(), chunk, charging, surrogate); e.failure()) return e;
  const int64_t T = x.dimensions()[0], M = x.dimensions()[1];
  const Params<F> p = MakeParams<F>(T, M, kind, k.typed_data()[0], tau, hard, detach, v_seq, decay_input, v_reset,
                                    v_th, alpha);
  const RecomputeFn<F> recompute = hard ? PickRecompute<F, true>(charging) : PickRecompute<F, false>(charging);
  const ReverseFn<F> reverse = kind == 2 ? PickReverse<F, true>(surrogate) : PickReverse<F, false>(surrogate);
  const F *xd = x.typed_data(), *v0d = v0.typed_data(), *dsd = ds.typed_data();
  const F* dvd = dv.dimensions().size() == 0 ? nullptr : dv.typed_data();
  const int64_t v0_size = v0.dimensions().size() == 0 ? 1 : M;
  F *dxd = dx->typed_data(), *dkd = dk->typed_data();
  F* dv0d = dv0->dimensions().size() == 0 ? nullptr : dv0->typed_data();
  if (dv0d == nullptr) dv0->typed_data()[0] = F(0);
  ParallelChunks<F>(pool, (M + chunk - 1) / chunk, (T + 5) * chunk, [=](int64_t c, F* scratch) {
    F *h = scratch, *a = h + T * chunk, *b = a + chunk, *d = b + chunk, *g = d + chunk, *row = g + chunk;
    const int64_t lo = c * chunk, hi = std::min(lo + chunk, M);
    recompute(p, lo, hi, xd, v0d, v0_size, h, a);
    dkd[c] = reverse(p, lo, hi, xd, v0d, v0_size, h, dsd, dvd, dxd, dv0d, b, d, g, row);
  });
  return ffi::Error::Success();
}


// --- neurons given by their single step: generated chunk functions, looked up by key --------------------

// fwd(T, M, lo, hi, x, s0, p, out, v_seq or null, last, scratch, shared); bwd(T, M, lo, hi, x, s0, p, dout,
// dv_seq or null, dlast, dx, ds0, dp, scratch, shared): one chunk of neurons [lo, hi), every array in the
// kernel's float type; scratch holds `scratch` values (an attribute the generator sets), uninitialised. s0 is
// [S, M], or [S] (shared = 1): one start per state variable for every neuron, whose ds0 (a constant's) is 0.
using StepForwardFn = void (*)(int64_t, int64_t, int64_t, int64_t, const void*, const void*, const void*, void*,
                               void*, void*, void*, int64_t);
using StepBackwardFn = void (*)(int64_t, int64_t, int64_t, int64_t, const void*, const void*, const void*,
                                const void*, const void*, const void*, void*, void*, void*, void*, int64_t);
struct StepFns {
  StepForwardFn fwd;
  StepBackwardFn bwd;
};

std::mutex& StepMutex() {
  static std::mutex mu;
  return mu;
}
std::unordered_map<int64_t, StepFns>& StepRegistry() {
  static auto* registry = new std::unordered_map<int64_t, StepFns>();
  return *registry;
}

bool FindStep(int64_t key, StepFns* fns) {
  std::lock_guard<std::mutex> lock(StepMutex());
  auto it = StepRegistry().find(key);
  if (it == StepRegistry().end()) return false;
  *fns = it->second;
  return true;
}

template <ffi::DataType DT>
ffi::Error StepForward(ffi::ThreadPool pool, ffi::Buffer<DT> x, ffi::Buffer<DT> s0, ffi::Buffer<DT> p,
                       ffi::ResultBuffer<DT> out, ffi::ResultBuffer<DT> v, ffi::ResultBuffer<DT> last, int64_t key,
                       bool v_seq, int64_t chunk, int64_t scratch) {
  using F = ffi::NativeType<DT>;
  StepFns fns;
  if (!FindStep(key, &fns)) return ffi::Error::InvalidArgument("no generated step kernel under this key");
  if (x.dimensions().size() != 2 || chunk <= 0) return ffi::Error::InvalidArgument("x must be [T, M], chunk > 0");
  const int64_t T = x.dimensions()[0], M = x.dimensions()[1];
  const F *xd = x.typed_data(), *s0d = s0.typed_data(), *pd = p.typed_data();
  F *od = out->typed_data(), *vd = v_seq ? v->typed_data() : nullptr, *ld = last->typed_data();
  const int64_t shared = s0.dimensions().size() == 1;
  ParallelChunks<F>(pool, (M + chunk - 1) / chunk, scratch, [=](int64_t c, F* work) {
    const int64_t lo = c * chunk;
    fns.fwd(T, M, lo, std::min(lo + chunk, M), xd, s0d, pd, od, vd, ld, work, shared);
  });
  return ffi::Error::Success();
}

template <ffi::DataType DT>
ffi::Error StepBackward(ffi::ThreadPool pool, ffi::Buffer<DT> x, ffi::Buffer<DT> s0, ffi::Buffer<DT> p,
                        ffi::Buffer<DT> dout, ffi::Buffer<DT> dv, ffi::Buffer<DT> dlast, ffi::ResultBuffer<DT> dx,
                        ffi::ResultBuffer<DT> ds0, ffi::ResultBuffer<DT> dp, int64_t key, bool v_seq,
                        int64_t chunk, int64_t scratch) {
  using F = ffi::NativeType<DT>;
  StepFns fns;
  if (!FindStep(key, &fns)) return ffi::Error::InvalidArgument("no generated step kernel under this key");
  if (x.dimensions().size() != 2 || chunk <= 0) return ffi::Error::InvalidArgument("x must be [T, M], chunk > 0");
  const int64_t T = x.dimensions()[0], M = x.dimensions()[1];
  const int64_t P = p.dimensions().size() ? p.dimensions()[0] : 0;
  const F *xd = x.typed_data(), *s0d = s0.typed_data(), *pd = p.typed_data(), *dod = dout.typed_data();
  const F *dvd = dv.dimensions().size() == 2 ? dv.typed_data() : nullptr, *dld = dlast.typed_data();
  F *dxd = dx->typed_data(), *ds0d = ds0->typed_data(), *dpd = dp->typed_data();
  const int64_t shared = s0.dimensions().size() == 1;
  if (shared) std::fill(ds0d, ds0d + s0.element_count(), F(0));
  ParallelChunks<F>(pool, (M + chunk - 1) / chunk, scratch, [=](int64_t c, F* work) {
    const int64_t lo = c * chunk;
    fns.bwd(T, M, lo, std::min(lo + chunk, M), xd, s0d, pd, dod, dvd, dld, dxd, ds0d, dpd + c * P, work, shared);
  });
  return ffi::Error::Success();
}

}  // namespace
}  // namespace snnjax

extern "C" void SnnStepRegister(int64_t key, void* fwd, void* bwd) {
  std::lock_guard<std::mutex> lock(snnjax::StepMutex());
  snnjax::StepRegistry()[key] = {reinterpret_cast<snnjax::StepForwardFn>(fwd),
                                 reinterpret_cast<snnjax::StepBackwardFn>(bwd)};
}

#define SNN_ATTRS                                                                                         \
  .Attr<bool>("hard").Attr<bool>("detach").Attr<bool>("v_seq").Attr<bool>("decay_input")                  \
      .Attr<double>("v_reset").Attr<double>("v_th").Attr<double>("tau").Attr<double>("alpha")             \
      .Attr<int64_t>("chunk")

#define SNN_DEFINE(DT, SUFFIX)                                                                            \
  XLA_FFI_DEFINE_HANDLER_SYMBOL(SnnNeuronForward##SUFFIX, snnjax::Forward<DT>,                             \
                                ffi::Ffi::Bind()                                                          \
                                    .Ctx<ffi::ThreadPool>()                                               \
                                    .Arg<ffi::Buffer<DT>>()                                               \
                                    .Arg<ffi::Buffer<DT>>()                                               \
                                    .Arg<ffi::Buffer<DT>>()                                               \
                                    .Ret<ffi::Buffer<DT>>()                                               \
                                    .Ret<ffi::Buffer<DT>>()                                               \
                                    .Attr<int64_t>("kind")                                                \
                                    .Attr<int64_t>("charging") SNN_ATTRS);                                \
  XLA_FFI_DEFINE_HANDLER_SYMBOL(SnnNeuronBackward##SUFFIX, snnjax::Backward<DT>,                           \
                                ffi::Ffi::Bind()                                                          \
                                    .Ctx<ffi::ThreadPool>()                                               \
                                    .Arg<ffi::Buffer<DT>>()                                               \
                                    .Arg<ffi::Buffer<DT>>()                                               \
                                    .Arg<ffi::Buffer<DT>>()                                               \
                                    .Arg<ffi::Buffer<DT>>()                                               \
                                    .Arg<ffi::Buffer<DT>>()                                               \
                                    .Ret<ffi::Buffer<DT>>()                                               \
                                    .Ret<ffi::Buffer<DT>>()                                               \
                                    .Ret<ffi::Buffer<DT>>()                                               \
                                    .Attr<int64_t>("kind")                                                \
                                    .Attr<int64_t>("charging")                                            \
                                    .Attr<int64_t>("surrogate") SNN_ATTRS);

SNN_DEFINE(ffi::F32, F32)
SNN_DEFINE(ffi::F64, F64)

#define SNN_STEP_DEFINE(DT, SUFFIX)                                                                       \
  XLA_FFI_DEFINE_HANDLER_SYMBOL(SnnStepForward##SUFFIX, snnjax::StepForward<DT>,                           \
                                ffi::Ffi::Bind()                                                          \
                                    .Ctx<ffi::ThreadPool>()                                               \
                                    .Arg<ffi::Buffer<DT>>()                                               \
                                    .Arg<ffi::Buffer<DT>>()                                               \
                                    .Arg<ffi::Buffer<DT>>()                                               \
                                    .Ret<ffi::Buffer<DT>>()                                               \
                                    .Ret<ffi::Buffer<DT>>()                                               \
                                    .Ret<ffi::Buffer<DT>>()                                               \
                                    .Attr<int64_t>("key")                                                 \
                                    .Attr<bool>("v_seq")                                                  \
                                    .Attr<int64_t>("chunk")                                               \
                                    .Attr<int64_t>("scratch"));                                             \
  XLA_FFI_DEFINE_HANDLER_SYMBOL(SnnStepBackward##SUFFIX, snnjax::StepBackward<DT>,                         \
                                ffi::Ffi::Bind()                                                          \
                                    .Ctx<ffi::ThreadPool>()                                               \
                                    .Arg<ffi::Buffer<DT>>()                                               \
                                    .Arg<ffi::Buffer<DT>>()                                               \
                                    .Arg<ffi::Buffer<DT>>()                                               \
                                    .Arg<ffi::Buffer<DT>>()                                               \
                                    .Arg<ffi::Buffer<DT>>()                                               \
                                    .Arg<ffi::Buffer<DT>>()                                               \
                                    .Ret<ffi::Buffer<DT>>()                                               \
                                    .Ret<ffi::Buffer<DT>>()                                               \
                                    .Ret<ffi::Buffer<DT>>()                                               \
                                    .Attr<int64_t>("key")                                                 \
                                    .Attr<bool>("v_seq")                                                  \
                                    .Attr<int64_t>("chunk")                                               \
                                    .Attr<int64_t>("scratch"));

SNN_STEP_DEFINE(ffi::F32, F32)
SNN_STEP_DEFINE(ffi::F64, F64)
