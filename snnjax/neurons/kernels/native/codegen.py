"""Native CPU kernels for any neuron given by its single step: the step and its VJP traced to C++ and compiled.

A ``base.StepNeuron`` (a neuron written through ``BaseNode``'s hooks, the catalogue's, or the built-in IF / LIF /
PLIF as ``base.as_step_neuron``) is traced twice with ``jax.make_jaxpr`` on a few lanes of neurons: its step
``(x, state, params) -> (out, state)`` and the step's VJP ``(x, state, params, d_out, d_state) -> (dx, d_state,
d_params)``. Each equation of the two jaxprs becomes one C++ statement on one neuron (``+``, ``exp``, a select,
...; calls and ``custom_jvp`` / ``custom_vjp`` are inlined), inside the loops of the built-in kernels: per chunk
of neurons, the forward runs the T steps with the state in a chunk-sized scratch; the backward recomputes the
states before each step into a ``[T, S, chunk]`` scratch (L2-sized) and runs the VJP backwards in time, summing
each parameter's gradient per lane. Nothing ``[T, M]``-sized is stored between forward and backward but X.

The source is compiled with the flags of the built-in kernels (``build.flags``: no contraction into fused
multiply-adds, so additions and products round as XLA's do) into a small library cached beside them, keyed by
its text; its two chunk functions are registered with the native library (``SnnStepRegister``) under a key
from the same hash, which the XLA FFI handlers ``SnnStep{Forward,Backward}{F32,F64}`` take as an attribute and
run on XLA's intra-op thread pool.

What the generator runs (``Unsupported`` says why not, naming the equation): elementwise steps (every value
one per neuron or a scalar), float32 / float64 state, scalar parameters, the primitives of ``_UNARY`` /
``_BINARY`` / ``_COMPARE`` and a few more (selects, casts, integer powers, clamps, rounding). Arithmetic is
IEEE as XLA's, so steps of +, -, *, / and selects give XLA's bits; ``exp``, ``log``, ``tanh``, ``logistic`` and
the like come from the C++ library, which rounds differently from XLA's own approximations in the last bits.
"""
from __future__ import annotations

import collections
import ctypes
import dataclasses
import functools
import hashlib
import math
import os
import pathlib
import subprocess
import tempfile

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend import core as jex_core

from snnjax.neurons import base as B
from snnjax.neurons.kernels.native import build

LANES = 3  # the lanes the step is traced on: a value of another shape is a reduction or a reshape (refused)


class Unsupported(ValueError):
    """The step cannot be generated as a native kernel; the message says why."""


_UNARY = {
    "exp": "std::exp", "exp2": "std::exp2", "log": "std::log", "log1p": "std::log1p", "expm1": "std::expm1",
    "tanh": "std::tanh", "sqrt": "std::sqrt", "cbrt": "std::cbrt", "sin": "std::sin", "cos": "std::cos",
    "tan": "std::tan", "asin": "std::asin", "acos": "std::acos", "atan": "std::atan", "sinh": "std::sinh",
    "cosh": "std::cosh", "asinh": "std::asinh", "acosh": "std::acosh", "atanh": "std::atanh", "erf": "std::erf",
    "erfc": "std::erfc", "floor": "std::floor", "ceil": "std::ceil", "abs": "std::fabs",
}
_BINARY = {"add": "+", "add_any": "+", "sub": "-", "mul": "*", "div": "/"}
_LOGICAL = {"and": "&&", "or": "||", "xor": "!="}
_COMPARE = {"ge": ">=", "gt": ">", "le": "<=", "lt": "<", "eq": "==", "ne": "!="}
_CALLS = {"pjit": "jaxpr", "jit": "jaxpr", "closed_call": "call_jaxpr", "core_call": "call_jaxpr",
          "custom_jvp_call": "call_jaxpr", "custom_vjp_call": "call_jaxpr", "checkpoint": "jaxpr",
          "remat": "jaxpr"}
_IDENTITY = ("copy", "copy_p", "stop_gradient", "broadcast_in_dim", "reshape", "squeeze", "expand_dims",
             "optimization_barrier")


@dataclasses.dataclass(frozen=True)
class Kernel:
    """A generated, compiled and registered kernel: its registry ``key``, the state names (``"v"`` first) and the
    number of scalar parameters."""

    key: int
    names: tuple[str, ...]
    n_params: int


def _literal(value, ctype: str) -> str:
    if ctype == "bool":
        return "true" if bool(value) else "false"
    v = float(value)
    if math.isnan(v):
        return "std::numeric_limits<F>::quiet_NaN()"
    if math.isinf(v):
        return ("" if v > 0 else "-") + "std::numeric_limits<F>::infinity()"
    return f"F({v.hex()})"


class _Emitter:
    """Turns jaxpr equations into C++ statements on one neuron (``F`` the float type, ``bool`` predicates).

    A product with one use that feeds a sum or difference becomes ``std::fma`` (``render``): XLA's CPU backend
    leaves that contraction to LLVM, which makes it there, so the generated step rounds as the ``scan`` path.
    """

    def __init__(self, dtype, first: int = 0):
        self.dtype = jnp.dtype(dtype)
        self.records: list[tuple[str, str, str, list[str]]] = []  # (var, ctype, op, args) with op text or mul/add/sub
        self.count = first
        self.constants: dict[str, object] = {}  # literal text -> value, for divisions by a constant

    def ctype(self, aval, where: str) -> str:
        if aval.shape not in ((), (LANES,)):
            raise Unsupported(f"{where} has shape {aval.shape}: the generated kernels run steps in which every "
                              "value is one per neuron (no reductions or reshapes over neurons)")
        if aval.dtype == jnp.bool_:
            return "bool"
        if aval.dtype != self.dtype:
            raise Unsupported(f"{where} is {aval.dtype}, not the state dtype {self.dtype}")
        return "F"

    def literal(self, value, ctype: str) -> str:
        text = _literal(value, ctype)
        self.constants[text] = value
        return text

    def run(self, jaxpr, consts, args: list[str]) -> list[str]:
        env = {}

        def read(atom):
            if isinstance(atom, jex_core.Literal):
                value = np.asarray(atom.val).reshape(-1)[0]
                if jnp.issubdtype(atom.aval.dtype, jnp.integer) and atom.aval.shape == ():
                    return self.literal(float(value), "F")  # usable only through a convert_element_type
                return self.literal(value, self.ctype(atom.aval, "a literal"))
            return env[atom]

        for var, const in zip(jaxpr.constvars, consts, strict=True):
            if np.size(const) != 1:
                raise Unsupported(f"the step closes over an array of shape {np.shape(const)}; the generated "
                                  "kernels take scalar constants only")
            env[var] = self.literal(np.asarray(const).reshape(-1)[0], self.ctype(var.aval, "a constant"))
        env.update(zip(jaxpr.invars, args, strict=True))
        for eqn in jaxpr.eqns:
            outs = self.eqn(eqn, [read(a) for a in eqn.invars])
            env.update(zip(eqn.outvars, outs, strict=True))
        return [read(a) for a in jaxpr.outvars]

    def eqn(self, eqn, ins: list[str]) -> list[str]:
        name = eqn.primitive.name
        where = f"the step's {name!r}"
        if name in _CALLS:
            sub = eqn.params.get(_CALLS[name]) or eqn.params.get("fun_jaxpr")
            if hasattr(sub, "jaxpr"):  # a ClosedJaxpr
                return self.run(sub.jaxpr, sub.consts, ins)
            return self.run(sub, [], ins)
        if (name == "convert_element_type" and jnp.issubdtype(eqn.invars[0].aval.dtype, jnp.integer)
                and ins[0] in self.constants and eqn.outvars[0].aval.dtype == self.dtype):
            return [ins[0]]  # an integer constant (a clip's bound), already written as a float literal
        if len(eqn.outvars) != 1:
            raise Unsupported(f"{where} has {len(eqn.outvars)} results; the generated kernels compute one per equation")
        (out,) = eqn.outvars
        ctype = self.ctype(out.aval, where)
        for a in eqn.invars:
            self.ctype(a.aval, where)
        op, args = self.expr(name, eqn.params, ins, [a.aval for a in eqn.invars], ctype, where)
        if op is None:  # an identity
            return [args[0]]
        self.count += 1
        var = f"t{self.count}"
        self.records.append((var, ctype, op, args))
        return [var]

    def expr(self, name, params, a, avals, ctype, where):  # noqa: PLR0911, PLR0912 (one case per primitive)
        """``(op, args)``: op ``"mul"`` / ``"add"`` / ``"sub"`` (kept apart for contraction), a C++ expression of
        the args' names, or None for an identity."""
        if name == "div" and a[1] in self.constants and ctype == "F":
            # XLA's simplifier turns A / c into A * (1 / c), the reciprocal rounded to the element type: so here.
            one = self.dtype.type(1)
            return "mul", [a[0], self.literal(one / self.dtype.type(self.constants[a[1]]), "F")]
        if name == "mul" and ctype == "F":
            return "mul", a
        if name in ("add", "add_any", "sub") and ctype == "F":
            return ("sub" if name == "sub" else "add"), a
        if name in _BINARY:
            return f"{a[0]} {_BINARY[name]} {a[1]}", a
        if name in _COMPARE:
            return f"{a[0]} {_COMPARE[name]} {a[1]}", a
        if name in _UNARY:
            return f"{_UNARY[name]}({a[0]})", a
        if name in _IDENTITY:
            return None, a
        if name == "neg":
            return f"-{a[0]}", a
        if name == "logistic":
            return f"F(1) / (F(1) + std::exp(-{a[0]}))", a
        if name == "rsqrt":
            return f"F(1) / std::sqrt({a[0]})", a
        if name == "square":
            return f"{a[0]} * {a[0]}", a
        if name == "integer_pow":
            y = int(params["y"])
            if y == 0:
                return "F(1)", a
            prod = " * ".join([a[0]] * abs(y))
            return (f"({prod})" if y > 0 else f"F(1) / ({prod})"), a
        if name == "pow":
            return f"std::pow({a[0]}, {a[1]})", a
        if name == "atan2":
            return f"std::atan2({a[0]}, {a[1]})", a
        if name == "rem":
            return f"std::fmod({a[0]}, {a[1]})", a
        if name in ("max", "min"):  # NaN-propagating, as XLA's
            op = ">" if name == "max" else "<"
            return f"(({a[0]} {op} {a[1]}) || ({a[0]} != {a[0]})) ? {a[0]} : {a[1]}", a
        if name == "sign":
            return f"{a[0]} > F(0) ? F(1) : ({a[0]} < F(0) ? F(-1) : {a[0]})", a
        if name == "clamp":  # clamp(lo, x, hi)
            return f"std::min(std::max({a[1]}, {a[0]}), {a[2]})", a
        if name == "round":
            even = int(getattr(params.get("rounding_method"), "value", params.get("rounding_method", 0))) == 1
            return f"{'std::nearbyint' if even else 'std::round'}({a[0]})", a
        if name == "is_finite":
            return f"std::isfinite({a[0]})", a
        if name in ("and", "or", "xor") and all(v.dtype == jnp.bool_ for v in avals):
            return f"{a[0]} {_LOGICAL[name]} {a[1]}", a
        if name == "not" and avals[0].dtype == jnp.bool_:
            return f"!{a[0]}", a
        if name == "select_n" and avals[0].dtype == jnp.bool_ and len(a) == 3:
            return f"{a[0]} ? {a[2]} : {a[1]}", a
        if name == "convert_element_type":
            src = "bool" if avals[0].dtype == jnp.bool_ else "F"
            if ctype == src:
                return None, a
            return (f"({a[0]} ? F(1) : F(0))" if src == "bool" else f"({a[0]} != F(0))"), a
        raise Unsupported(f"{where} (with {params}) is not one the generated kernels compute")

    def render(self, outputs: list[str]) -> list[str]:
        """The statements, products with one use contracted into the sum or difference that uses them."""
        uses = collections.Counter(outputs)
        for _, _, _, args in self.records:
            uses.update(args)
        muls = {var: args for var, _, op, args in self.records if op == "mul" and uses[var] == 1}
        fused, lines = set(), []
        for var, ctype, op, args in self.records:
            if op in ("add", "sub"):
                a, b = args
                if a in muls:
                    x, y = muls[a]
                    text = f"SNN_FMA({x}, {y}, {b if op == 'add' else f'-{b}'})"
                    fused.add(a)
                elif b in muls:
                    x, y = muls[b]
                    text = f"SNN_FMA({x if op == 'add' else f'-{x}'}, {y}, {a})"
                    fused.add(b)
                else:
                    text = f"{a} {'+' if op == 'add' else '-'} {b}"
            elif op == "mul":
                text = f"{args[0]} * {args[1]}"
            else:
                text = op
            lines.append((var, f"const {ctype} {var} = {text};"))
        return [line for var, line in lines if var not in fused]


def trace(neuron: B.StepNeuron, dtype):
    """``(forward jaxpr, backward jaxpr)`` on ``LANES`` neurons: the step ``(x, *states, *params) -> (out,
    *states)`` and its VJP ``(x, *states, *params, d_out, *d_states) -> (dx, *d_states, *d_params)``; the params'
    leaves (scalars) enter as one value per lane, so their gradients stay per lane."""
    names = neuron.names
    leaves = jax.tree.leaves(neuron.params_like)
    for leaf in leaves:
        if math.prod(leaf.shape) != 1:
            raise Unsupported(f"a parameter of shape {leaf.shape}: the generated kernels take scalar "
                              "parameters (one value shared by every neuron)")
    lane = jax.ShapeDtypeStruct((LANES,), dtype)
    p_lanes = [jax.ShapeDtypeStruct((LANES,), a.dtype) for a in leaves]
    n_s, n_p = len(names), len(leaves)
    step, _ = neuron.flat_step()

    def fwd(x, *flat):
        out, new = step(x, list(flat[:n_s]), list(flat[n_s:]))
        return [out, *new]

    def bwd(x, *flat):
        states, prm, d_out, d_new = flat[:n_s], flat[n_s:n_s + n_p], flat[n_s + n_p], flat[n_s + n_p + 1:]
        _, vjp = jax.vjp(lambda x, s, p: step(x, s, p), x, list(states), list(prm))
        dx, d_states, d_prm = vjp((d_out, list(d_new)))
        return [dx, *d_states, *d_prm]

    with B.per_neuron():
        f = jax.make_jaxpr(fwd)(lane, *[lane] * n_s, *p_lanes)
        b = jax.make_jaxpr(bwd)(lane, *[lane] * n_s, *p_lanes, *[lane] * (1 + n_s))
    return f, b


def _lane_loop(dtype, jaxpr, args: list[str], stores) -> list[str]:
    """One loop over the chunk's lanes: read ``args`` (C++ expressions, one per jaxpr input) into locals, run the
    jaxpr, then the statements ``stores(outputs)`` (every read happens before any store)."""
    body = _Emitter(dtype)
    loads = [f"const {'F'} a{j} = {arg};" for j, arg in enumerate(args)]
    outs = body.run(jaxpr.jaxpr, jaxpr.consts, [f"a{j}" for j in range(len(args))])
    lines = ["    for (int64_t i = 0; i < n; ++i) {"]
    lines += [f"      {ln}" for ln in (*loads, *body.render(outs), *stores(outs))] + ["    }"]
    return lines


def source(f_jaxpr, b_jaxpr, n_s: int, n_p: int, dtype, tag: str) -> str:
    """The C++ of the two chunk functions (``SnnStepRegister``'s contract in ``neuron_ffi.cc``)."""
    ctype = "float" if jnp.dtype(dtype) == jnp.float32 else "double"
    S, P = range(n_s), range(n_p)
    prm = [f"p{j}" for j in P]
    head = [f"const F p{j} = p[{j}];" for j in P]
    states = [f"st{k}[i]" for k in S]

    def fwd_store(v_seq):
        def stores(outs):
            lines = [f"ot[i] = {outs[0]};"] + [f"st{k}[i] = {outs[1 + k]};" for k in S]
            return lines + ([f"vt[i] = {outs[1]};"] if v_seq else [])
        return stores

    def bwd_args(dv_seq):
        d_state = ["(d0[i] + dvt[i])" if (k == 0 and dv_seq) else f"d{k}[i]" for k in S]
        return ["xt[i]", *[f"h{k}[i]" for k in S], *prm, "dot[i]", *d_state]

    def bwd_store(outs):
        return ([f"dxt[i] = {outs[0]};"] + [f"d{k}[i] = {outs[1 + k]};" for k in S]
                + [f"g{j}[i] += {outs[1 + n_s + j]};" for j in P])

    def recompute_store(outs):
        return [f"h{k}[i] = a{1 + k};" for k in S] + [f"st{k}[i] = {outs[1 + k]};" for k in S]

    fwd_loop = {v: _lane_loop(dtype, f_jaxpr, ["xt[i]", *states, *prm], fwd_store(v)) for v in (False, True)}
    re_loop = _lane_loop(dtype, f_jaxpr, ["xt[i]", *states, *prm], recompute_store)
    bwd_loop = {d: _lane_loop(dtype, b_jaxpr, bwd_args(d), bwd_store) for d in (False, True)}
    restrict = "F* __restrict__"

    def start(k):  # [S, M] per neuron, or [S] (shared): one start per state variable for every neuron
        return f"shared ? init[{k}] : init[{k} * M + lo + i]"

    lines = [
        *_PREAMBLE,
        f"typedef {ctype} F;",
        f'extern "C" void snn_step_fwd_{tag}(int64_t T, int64_t M, int64_t lo, int64_t hi, const void* xv,',
        "    const void* s0v, const void* pv, void* outv, void* vseqv, void* lastv, void* workv, int64_t shared) {",
        "  const F* x = (const F*)xv; const F* init = (const F*)s0v; const F* p = (const F*)pv;",
        "  F* out = (F*)outv; F* vseq = (F*)vseqv; F* last = (F*)lastv; F* work = (F*)workv;",
        "  const int64_t n = hi - lo;", *[f"  {h}" for h in head],
        *[f"  {restrict} st{k} = work + {k} * n;" for k in S],
        *[f"  for (int64_t i = 0; i < n; ++i) st{k}[i] = {start(k)};" for k in S],
        "  for (int64_t t = 0; t < T; ++t) {",
        "    const F* __restrict__ xt = x + t * M + lo; F* __restrict__ ot = out + t * M + lo;",
        "    if (vseq) {", "    F* __restrict__ vt = vseq + t * M + lo;", *fwd_loop[True], "    } else {",
        *fwd_loop[False], "    }", "  }",
        *[f"  for (int64_t i = 0; i < n; ++i) last[{k} * M + lo + i] = st{k}[i];" for k in S],
        "}",
        f'extern "C" void snn_step_bwd_{tag}(int64_t T, int64_t M, int64_t lo, int64_t hi, const void* xv,',
        "    const void* s0v, const void* pv, const void* doutv, const void* dvseqv, const void* dlastv,",
        "    void* dxv, void* ds0v, void* dpv, void* workv, int64_t shared) {",
        "  const F* x = (const F*)xv; const F* init = (const F*)s0v; const F* p = (const F*)pv;",
        "  const F* dout = (const F*)doutv; const F* dvseq = (const F*)dvseqv; const F* dlast = (const F*)dlastv;",
        "  F* dx = (F*)dxv; F* ds0 = (F*)ds0v; F* dp = (F*)dpv; F* work = (F*)workv;",
        "  const int64_t n = hi - lo;", *[f"  {h}" for h in head],
        f"  F* hist = work; F* rest = work + T * {n_s} * n;",
        *[f"  {restrict} st{k} = rest + {k} * n;" for k in S],
        *[f"  {restrict} d{k} = rest + {n_s + k} * n;" for k in S],
        *[f"  {restrict} g{j} = rest + {2 * n_s + j} * n;" for j in P],
        *[f"  for (int64_t i = 0; i < n; ++i) st{k}[i] = {start(k)};" for k in S],
        "  for (int64_t t = 0; t < T; ++t) {  // the states before each step",
        "    const F* __restrict__ xt = x + t * M + lo;",
        *[f"    {restrict} h{k} = hist + (t * {n_s} + {k}) * n;" for k in S],
        *re_loop, "  }",
        *[f"  for (int64_t i = 0; i < n; ++i) d{k}[i] = dlast[{k} * M + lo + i];" for k in S],
        *[f"  for (int64_t i = 0; i < n; ++i) g{j}[i] = F(0);" for j in P],
        "  for (int64_t t = T - 1; t >= 0; --t) {",
        "    const F* __restrict__ xt = x + t * M + lo; const F* __restrict__ dot = dout + t * M + lo;",
        "    F* __restrict__ dxt = dx + t * M + lo;",
        *[f"    const F* __restrict__ h{k} = hist + (t * {n_s} + {k}) * n;" for k in S],
        "    if (dvseq) {", "    const F* __restrict__ dvt = dvseq + t * M + lo;", *bwd_loop[True],
        "    } else {", *bwd_loop[False], "    }", "  }",
        "  if (!shared) {",
        *[f"  for (int64_t i = 0; i < n; ++i) ds0[{k} * M + lo + i] = d{k}[i];" for k in S],
        "  }",
        *[f"  {{ F acc = F(0); for (int64_t i = 0; i < n; ++i) acc += g{j}[i]; dp[{j}] = acc; }}" for j in P],
        "}",
    ]
    return "\n".join(lines) + "\n"


# SNN_FMA contracts as XLA's CPU backend does (LLVM makes a fused multiply-add wherever the target has one);
# SNN_VECTOR_MATH declares glibc's vector exp / log / sin / cos (libmvec), so loops that call them vectorise.
_PREAMBLE = (
    "#include <cmath>", "#include <cstdint>", "#include <limits>", "#include <algorithm>",
    "#if defined(__FMA__) || defined(__aarch64__)", "#define SNN_FMA(a, b, c) std::fma(a, b, c)", "#else",
    "#define SNN_FMA(a, b, c) ((a) * (b) + (c))", "#endif", "#ifdef SNN_VECTOR_MATH",
    *[f'extern "C" {t} {f}{sfx}({t}) noexcept __attribute__((simd("notinbranch")));'
      for f in ("exp", "log", "sin", "cos") for t, sfx in (("float", "f"), ("double", ""))],
    "#endif",
)


def scratch_values(T: int, n_s: int, n_p: int, chunk: int) -> int:
    """Scratch values per worker: the backward's states before each step, then state, cotangent and gradient rows."""
    return (T * n_s + 2 * n_s + n_p) * chunk


@functools.cache
def _compiled(text: str) -> int:
    """Compile ``text`` (cached on disk by its hash), register its chunk functions; returns their key."""
    lib = build.load()
    digest = hashlib.sha256(text.encode())
    for part in (build.compiler(), " ".join(build.flags())):
        digest.update(part.encode())
    tag = digest.hexdigest()[:15]
    path = build.cache_dir() / f"snnjax_step_{tag}.so"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=path.parent) as tmp:
            src, tmp_lib = pathlib.Path(tmp) / "step.cc", pathlib.Path(tmp) / path.name
            src.write_text(text)
            cmd = [build.compiler(), *build.flags(), "-fno-math-errno", str(src), "-o", str(tmp_lib)]
            result = subprocess.run([*cmd, "-DSNN_VECTOR_MATH", "-lmvec"], capture_output=True, text=True)
            if result.returncode:  # no libmvec here: scalar calls
                result = subprocess.run(cmd, capture_output=True, text=True)
            if result.returncode:
                raise build.NativeBuildError(f"compiling a generated step kernel failed:\n{' '.join(cmd)}\n"
                                             f"{result.stderr[-3000:]}\n{text[:3000]}")
            os.replace(tmp_lib, path)
    step_lib = ctypes.cdll.LoadLibrary(str(path))
    _LOADED.append(step_lib)  # kept for the process: XLA calls into it
    fn_tag = text.split("snn_step_fwd_", 1)[1].split("(", 1)[0]
    fwd = ctypes.cast(getattr(step_lib, f"snn_step_fwd_{fn_tag}"), ctypes.c_void_p).value
    bwd = ctypes.cast(getattr(step_lib, f"snn_step_bwd_{fn_tag}"), ctypes.c_void_p).value
    key = int(fn_tag, 16)
    lib.SnnStepRegister.argtypes = [ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p]
    lib.SnnStepRegister(key, fwd, bwd)
    return key


_LOADED: list[ctypes.CDLL] = []


@functools.lru_cache(maxsize=256)
def kernel(neuron: B.StepNeuron, dtype) -> Kernel:
    """The compiled kernel of ``neuron`` (its ``params_like``: scalars) in ``dtype`` (float32 or float64).

    Raises ``Unsupported`` (why the step cannot be generated) or ``build.NativeBuildError``.
    """
    dtype = jnp.dtype(dtype)
    if dtype not in (jnp.dtype(jnp.float32), jnp.dtype(jnp.float64)):
        raise Unsupported(f"the generated kernels compute in float32 or float64, not {dtype}")
    f, b = trace(neuron, dtype)
    n_s, n_p = len(neuron.names), len(jax.tree.leaves(neuron.params_like))
    text = source(f, b, n_s, n_p, dtype, "TAG")
    tag = hashlib.sha256(text.encode()).hexdigest()[:15]
    key = _compiled(text.replace("_TAG(", f"_{tag}("))
    return Kernel(key, neuron.names, n_p)
