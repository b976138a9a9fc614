// XLA FFI handler running a 2-D float32 convolution (NHWC data, HWIO kernel, as nnx.Conv) through oneDNN, for
// the convolution benchmark (snnjax/bench/conv.py).
//
// SnnOnednnConvF32(a, b) -> out, by the attribute `mode`:
//   0 forward:          a = x [N, H, W, Ci],    b = w [kh, kw, Ci, Co]  -> y [N, Ho, Wo, Co]
//   1 input gradient:   a = dy [N, Ho, Wo, Co], b = w [kh, kw, Ci, Co]  -> dx [N, H, W, Ci]
//   2 kernel gradient:  a = x [N, H, W, Ci],    b = dy [N, Ho, Wo, Co]  -> dw [kh, kw, Ci, Co]
// strides [sh, sw]; padding [top, bottom, left, right].
//
// Threads (`parts`): above 0, the batch is cut into min(parts, N) slices run on XLA's intra-op pool, each by
// oneDNN on one thread (its primitives are made for one OpenMP thread, so no OpenMP team starts); the kernel
// gradient adds the slices' partial kernels. 0: one oneDNN call on OpenMP's threads (one per core), from the
// XLA thread that runs the op.
//
// The kernel goes through oneDNN's preferred layout (format `any`, reordered from / to HWIO each call); the data
// stays NHWC. Primitives are made once per problem and kept for the process.
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "oneapi/dnnl/dnnl.hpp"
#include "parallel_chunks.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace snnjax {
namespace {

using dnnl::memory;
using Tag = memory::format_tag;
constexpr auto kF32 = memory::data_type::f32;

dnnl::engine& Engine() {
  static dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

struct Geometry {
  int64_t n, h, w, ci, ho, wo, co, kh, kw, sh, sw, pt, pb, pl, pr;
  memory::desc Src() const { return memory::desc({n, ci, h, w}, kF32, Tag::nhwc); }
  memory::desc Dst() const { return memory::desc({n, co, ho, wo}, kF32, Tag::nhwc); }
  memory::desc Kernel(Tag tag) const { return memory::desc({co, ci, kh, kw}, kF32, tag); }
  auto Key(int64_t mode, int64_t threads) const {
    return std::make_tuple(mode, threads, n, h, w, ci, ho, wo, co, kh, kw, sh, sw, pt, pb, pl, pr);
  }
};

struct Plan {
  dnnl::primitive conv;
  memory::desc user_w, prim_w;  // the kernel as HWIO and in the primitive's layout
  bool reorder_w = false;
  dnnl::reorder w_reorder;  // HWIO -> primitive's (modes 0, 1), primitive's -> HWIO (mode 2)
  size_t scratch = 0;
};

// Made on the calling thread, whose OpenMP thread count the primitive keeps.
std::shared_ptr<Plan> GetPlan(int64_t mode, const Geometry& g, int64_t threads) {
  static std::mutex mu;
  static std::map<decltype(g.Key(0, 0)), std::shared_ptr<Plan>> plans;
  const auto key = g.Key(mode, threads);
  {
    std::lock_guard<std::mutex> lock(mu);
    auto it = plans.find(key);
    if (it != plans.end()) return it->second;
  }
  auto& eng = Engine();
  const memory::dims strides{g.sh, g.sw}, pad_l{g.pt, g.pl}, pad_r{g.pb, g.pr};
  const auto src = g.Src(), dst = g.Dst(), w_any = g.Kernel(Tag::any);
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);  // per-thread buffers: slices run at once
  auto plan = std::make_shared<Plan>();
  plan->user_w = g.Kernel(Tag::hwio);
  const auto direct = dnnl::algorithm::convolution_direct;
  dnnl::convolution_forward::primitive_desc fwd(eng, dnnl::prop_kind::forward_training, direct, src, w_any, dst,
                                                strides, pad_l, pad_r, attr);
  if (mode == 0) {
    plan->conv = dnnl::convolution_forward(fwd);
    plan->prim_w = fwd.weights_desc();
    plan->scratch = fwd.scratchpad_desc().get_size();
  } else if (mode == 1) {
    dnnl::convolution_backward_data::primitive_desc pd(eng, direct, src, w_any, dst, strides, pad_l, pad_r, fwd,
                                                       attr);
    plan->conv = dnnl::convolution_backward_data(pd);
    plan->prim_w = pd.weights_desc();
    plan->scratch = pd.scratchpad_desc().get_size();
  } else {
    dnnl::convolution_backward_weights::primitive_desc pd(eng, direct, src, w_any, dst, strides, pad_l, pad_r, fwd,
                                                          attr);
    plan->conv = dnnl::convolution_backward_weights(pd);
    plan->prim_w = pd.diff_weights_desc();
    plan->scratch = pd.scratchpad_desc().get_size();
  }
  plan->reorder_w = plan->prim_w != plan->user_w;
  if (plan->reorder_w) {
    const auto& from = mode == 2 ? plan->prim_w : plan->user_w;
    const auto& to = mode == 2 ? plan->user_w : plan->prim_w;
    plan->w_reorder = dnnl::reorder(dnnl::reorder::primitive_desc(eng, from, eng, to));
  }
  std::lock_guard<std::mutex> lock(mu);
  return plans.emplace(key, plan).first->second;
}

// Reorders the kernel between HWIO and the primitive's layout (the plan's direction).
void ReorderKernel(const Plan& p, int64_t mode, void* from, void* to) {
  dnnl::stream stream(Engine());
  memory m_from(mode == 2 ? p.prim_w : p.user_w, Engine(), from);
  memory m_to(mode == 2 ? p.user_w : p.prim_w, Engine(), to);
  p.w_reorder.execute(stream, m_from, m_to);
  stream.wait();
}

// One slice: `data` the slice's x (modes 0, 2) or dy (mode 1); `w` the kernel in the primitive's layout (or where
// mode 2 writes its gradient); `out` y (mode 0), dx (mode 1) or the slice's dy (mode 2, read).
void RunSlice(const Plan& p, int64_t mode, const Geometry& g, const float* data, float* w, float* out) {
  thread_local std::vector<char> scratch_buf;
  if (scratch_buf.size() < std::max<size_t>(p.scratch, 1)) scratch_buf.resize(std::max<size_t>(p.scratch, 1));
  auto& eng = Engine();
  dnnl::stream stream(eng);
  memory src(g.Src(), eng, mode == 1 ? out : const_cast<float*>(data));
  memory dst(g.Dst(), eng, mode == 1 ? const_cast<float*>(data) : out);
  memory wm(p.prim_w, eng, w);
  memory scratch(memory::desc({static_cast<int64_t>(scratch_buf.size())}, memory::data_type::u8, Tag::a), eng,
                 scratch_buf.data());
  if (mode == 0) {
    p.conv.execute(stream, {{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, wm}, {DNNL_ARG_DST, dst},
                            {DNNL_ARG_SCRATCHPAD, scratch}});
  } else if (mode == 1) {
    p.conv.execute(stream, {{DNNL_ARG_DIFF_DST, dst}, {DNNL_ARG_WEIGHTS, wm}, {DNNL_ARG_DIFF_SRC, src},
                            {DNNL_ARG_SCRATCHPAD, scratch}});
  } else {
    p.conv.execute(stream, {{DNNL_ARG_SRC, src}, {DNNL_ARG_DIFF_DST, dst}, {DNNL_ARG_DIFF_WEIGHTS, wm},
                            {DNNL_ARG_SCRATCHPAD, scratch}});
  }
  stream.wait();
}

// fn(task) for task in [0, tasks) on XLA's intra-op pool, each task's oneDNN primitives run serially
// (this thread's OpenMP setting only).
template <typename Fn>
void Parallel(ffi::ThreadPool& pool, int64_t tasks, Fn fn) {
  ParallelChunks<char>(pool, tasks, 0, [fn](int64_t task, char*) {
    omp_set_num_threads(1);
    fn(task);
  });
}

ffi::Error Conv(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> a, ffi::Buffer<ffi::F32> b,
                ffi::ResultBuffer<ffi::F32> out, int64_t mode, ffi::Span<const int64_t> strides,
                ffi::Span<const int64_t> padding, int64_t parts) {
  const auto ad = a.dimensions(), bd = b.dimensions(), od = out->dimensions();
  if (ad.size() != 4 || bd.size() != 4 || od.size() != 4 || strides.size() != 2 || padding.size() != 4 ||
      mode < 0 || mode > 2)
    return ffi::Error::InvalidArgument("SnnOnednnConvF32: rank-4 operands, 2 strides, 4 paddings, mode 0-2");
  const int64_t* x = mode == 1 ? od.begin() : ad.begin();
  const int64_t* y = mode == 0 ? od.begin() : mode == 1 ? ad.begin() : bd.begin();
  const int64_t* k = mode == 2 ? od.begin() : bd.begin();
  const Geometry g{x[0], x[1], x[2], x[3], y[1], y[2], y[3], k[0], k[1], strides[0], strides[1],
                   padding[0], padding[1], padding[2], padding[3]};
  const float* pa = a.typed_data();
  float* pb = const_cast<float*>(b.typed_data());
  float* po = out->typed_data();
  try {
    const int64_t threads = parts > 0 ? 1 : omp_get_num_procs();
    omp_set_num_threads(static_cast<int>(threads));  // the plans below are made for this many threads
    const int64_t per = (g.n + std::max<int64_t>(parts, 1) - 1) / std::max<int64_t>(parts, 1);
    const int64_t slices = (g.n + per - 1) / per;
    std::vector<Geometry> geoms(slices, g);
    std::vector<std::shared_ptr<Plan>> plans(slices);
    for (int64_t s = 0; s < slices; ++s) {
      geoms[s].n = std::min(per, g.n - s * per);
      plans[s] = GetPlan(mode, geoms[s], threads);
    }
    const int64_t in_image = g.h * g.w * g.ci, out_image = g.ho * g.wo * g.co;
    const int64_t ksize = g.kh * g.kw * g.ci * g.co;
    if (mode != 2) {
      std::vector<float> w_buf;
      float* w = pb;
      if (plans[0]->reorder_w) {  // one layout for every slice's plan: their problems differ only in N
        w_buf.resize(plans[0]->prim_w.get_size() / sizeof(float));
        ReorderKernel(*plans[0], mode, pb, w_buf.data());
        w = w_buf.data();
      }
      const int64_t a_image = mode == 0 ? in_image : out_image, o_image = mode == 0 ? out_image : in_image;
      auto run = [&](int64_t s) {
        RunSlice(*plans[s], mode, geoms[s], pa + s * per * a_image, w, po + s * per * o_image);
      };
      if (parts > 0) Parallel(pool, slices, run); else run(0);
      return ffi::Error::Success();
    }
    // Kernel gradient: each slice's partial kernel in HWIO, then their sum.
    std::vector<std::vector<float>> partial(slices);
    auto run = [&](int64_t s) {
      const Plan& p = *plans[s];
      std::vector<float> prim(p.prim_w.get_size() / sizeof(float));
      float* dw = slices == 1 && !p.reorder_w ? po : prim.data();
      RunSlice(p, 2, geoms[s], pa + s * per * in_image, dw, pb + s * per * out_image);
      if (!p.reorder_w && slices > 1) {
        partial[s] = std::move(prim);
      } else if (p.reorder_w) {
        if (slices > 1) partial[s].resize(ksize);
        ReorderKernel(p, 2, prim.data(), slices > 1 ? partial[s].data() : po);
      }
    };
    if (parts > 0) Parallel(pool, slices, run); else run(0);
    if (slices > 1) {
      std::memcpy(po, partial[0].data(), ksize * sizeof(float));
      for (int64_t s = 1; s < slices; ++s)
        for (int64_t i = 0; i < ksize; ++i) po[i] += partial[s][i];
    }
  } catch (const dnnl::error& e) {
    return ffi::Error::Internal(std::string("oneDNN: ") + e.what());
  }
  return ffi::Error::Success();
}

}  // namespace
}  // namespace snnjax

XLA_FFI_DEFINE_HANDLER_SYMBOL(SnnOnednnConvF32, snnjax::Conv,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<int64_t>("mode")
                                  .Attr<ffi::Span<const int64_t>>("strides")
                                  .Attr<ffi::Span<const int64_t>>("padding")
                                  .Attr<int64_t>("parts"));
