"""Online training through time (OTTT, SLTT): the gradients of a batch one time step at a time.

SpikingJelly's ``ottt_online_training`` step for step: for ``t = 0 .. T-1`` the model runs one time step
(``x[t]``, every neuron in single-step mode from the state the previous step left), the step's loss
``config.loss`` of its logits is differentiated at once, and the state is carried on without its graph, so
gradients flow only through the current step ("spatial" gradients; SLTT). ``method="ottt"`` also enters
``snnjax.neurons.online.ottt_traces``: each ``OTTTLIFNode`` hands ``(spike, trace)`` to the layers after it, whose
weight gradients then use the presynaptic trace. The step's gradient is the *sum* over ``t`` (SpikingJelly's
accumulated ``loss.backward()``); with ``online_updates`` the optimizer instead applies each step's gradient at
once (SpikingJelly's ``online=True``: ``T`` updates per batch). The loop is a ``lax.scan`` whose carry holds the
neuron states and traces, the BatchNorm statistics, the gradient sum (or the parameters and optimizer state):
activation memory is that of one time step whatever ``T``.

BatchNorm in train mode normalises each step's ``[N, ...]`` on its own and updates its statistics every step,
as SpikingJelly's single-step layers do. Dropout draws one mask per batch for all steps (SpikingJelly's
``layer.Dropout`` keeps its mask until ``reset_net``).
"""
from __future__ import annotations

import contextlib

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from snnjax.neurons.modules import BaseNode, MembranePotential
from snnjax.neurons.online import OTTTLIFNode, ottt_traces
from snnjax.neurons.psn import PSN, MaskedPSN, SlidingPSN
from snnjax.parallel.logical import constrain
from snnjax.parallel.variables import fresh

METHODS = ("bptt", "ottt", "sltt")


def check_model(model: nnx.Module, method: str) -> None:
    """Raise ``ValueError`` if ``model`` cannot be trained by ``method`` one step at a time: it needs spiking
    neurons, and for ``"ottt"`` at least one ``OTTTLIFNode``, each held by a module whose layers take its
    ``(spike, trace)`` pairs (``hands_on_traces``, see ``snnjax.neurons.online.call_layer``)."""
    if method not in METHODS:
        raise ValueError(f"method={method!r} is not a training method; choose one of {list(METHODS)}")
    if method == "bptt":
        return
    name = type(model).__name__
    parallel = sorted({type(m).__name__ for _, m in nnx.iter_modules(model) if isinstance(m, (PSN, MaskedPSN,
                                                                                               SlidingPSN))})
    if parallel:
        raise ValueError(f"method={method!r} runs one time step at a time; {name} has {parallel}, parallel spiking "
                         "neurons that need the whole sequence at once: use method='bptt'")
    if not any(isinstance(m, BaseNode) for _, m in nnx.iter_modules(model)):
        raise ValueError(f"method={method!r} trains one time step at a time, carrying the neuron states; {name} has "
                         "no spiking neuron (snnjax.neurons): use method='bptt'")
    if method != "ottt":
        return
    modules = dict(nnx.iter_modules(model))
    ottt = [path for path, m in modules.items() if isinstance(m, OTTTLIFNode)]
    if not ottt:
        raise ValueError(f"method='ottt' takes its weight gradients from OTTTLIFNode traces; {name} has no "
                         "OTTTLIFNode: build it with spiking_neuron=OTTTLIFNode, or use method='sltt'")
    for path in ottt:
        parent = _parent(modules, path)
        if not getattr(parent, "hands_on_traces", False):
            raise ValueError(f"method='ottt': {name} calls the OTTTLIFNode {'.'.join(map(str, path))} in a "
                             f"{type(parent).__name__}, whose layers do not take its (spike, trace) pairs; write that "
                             "part as a snnjax.Sequential (SpikingJelly's OTTTSequential) or use method='sltt'")


def _parent(modules: dict, path: tuple) -> nnx.Module:
    """The module that holds the module at ``path`` (through any ``nnx.List`` / ``nnx.Dict``)."""
    for end in range(len(path) - 1, -1, -1):
        m = modules.get(path[:end])
        if m is not None and not isinstance(m, (nnx.List, nnx.Dict)):
            return m
    raise AssertionError(path)


def online_gradients(cfg, graphdef: nnx.GraphDef, tx: optax.GradientTransformation, state, x: jax.Array,
                     labels: jax.Array, drop_key: jax.Array, layout, acc_dtype, step_loss):
    """One batch ``x [T, N, ...]`` / ``labels [N]`` trained online (see the module docstring).

    ``step_loss(logits [1, N, K], labels) -> (loss, accuracy)`` is one step's batch-mean loss. Returns
    ``(grads, params, opt_state, model_state, loss, accuracy)``: the gradient summed over steps (with
    ``cfg.online_updates`` the last step's, already applied), the parameters and optimizer state after the
    batch (unchanged without ``online_updates``), the model state (BatchNorm statistics; neuron states as they came
    in), the mean over steps of the loss, and the accuracy of the time-mean logits.
    """
    if cfg.grad_accum_steps != 1 or layout.pipeline is not None:
        raise ValueError(f"method={cfg.method!r} trains the whole batch one time step at a time: it takes no "
                         "microbatches (StepConfig.grad_accum_steps=1, config.grad_accum_steps=1) and no pipeline")
    x = constrain(x, ("time", "batch") + (None,) * (x.ndim - 2))
    labels = constrain(labels, ("batch",))
    neurons_in, other_in = nnx.split_state(state.model_state, MembranePotential, ...)
    traces = ottt_traces if cfg.method == "ottt" else contextlib.nullcontext

    def forward(params, neuron_state, other, x_t):
        params = layout.constrain_params(params)
        model = nnx.merge(graphdef, params, fresh(state.rngs), fresh(nnx.merge_state(neuron_state, other)))
        nnx.reseed(model, dropout=drop_key)
        for _, node in nnx.iter_modules(model):
            if isinstance(node, BaseNode):
                node.step_mode = "s"
        with traces():
            logits = model(x_t[None])
        loss, _ = step_loss(logits, labels)
        new_neurons, new_other = nnx.split_state(nnx.split(model, nnx.Param, nnx.RngState, ...)[3],
                                                 MembranePotential, ...)
        return loss, (logits[0], new_neurons, new_other)

    logits_shape, shapes, _ = jax.eval_shape(lambda p, n, o, xt: forward(p, n, o, xt)[1], state.params, neurons_in,
                                             other_in, x[0])
    neurons0 = jax.tree.map(lambda v, s: jnp.broadcast_to(v, s.shape).astype(s.dtype), neurons_in, shapes)
    grad_fn = jax.value_and_grad(forward, has_aux=True)

    def body(carry, x_t):
        grads, params, opt_state, neuron_state, other, loss_sum, logit_sum = carry
        (loss, (logits, neuron_state, other)), g = grad_fn(params, neuron_state, other, x_t)
        g = layout.update_grads(g)
        if cfg.online_updates:
            old = layout.update_params(params)
            updates, opt_state = tx.update(g, opt_state, old)
            params, grads = layout.stored_params(optax.apply_updates(old, updates)), g
        else:
            grads = jax.tree.map(jnp.add, grads, g)
        return (grads, params, opt_state, neuron_state, other, loss_sum + loss.astype(acc_dtype),
                logit_sum + logits.astype(acc_dtype)), None

    zeros = layout.constrain_grads(jax.tree.map(lambda p: jnp.zeros(p.shape, p.dtype), state.params))
    init = (zeros, state.params, state.opt_state, neurons0, other_in, jnp.zeros((), acc_dtype),
            jnp.zeros(logits_shape.shape, acc_dtype))
    (grads, params, opt_state, _, other, loss_sum, logit_sum), _ = jax.lax.scan(body, init, x)
    accuracy = jnp.mean(jnp.argmax(logit_sum, -1) == labels).astype(acc_dtype)
    t = x.shape[0]
    return grads, params, opt_state, nnx.merge_state(neurons_in, other), loss_sum / t, accuracy

