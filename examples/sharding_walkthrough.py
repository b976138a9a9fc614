# %% [markdown]
# # Sharding a spiking network on one mesh
#
# Build a tiny Spikformer, look at the logical axis names its parameters carry, plan a
# layout (FSDP x tensor parallelism) on an 8-device mesh, see where every array lives,
# change one annotation and plan again, then run a train step and read its per-device
# memory and collectives from the compiled HLO.
#
# Runs as a script (`python examples/sharding_walkthrough.py`) or cell by cell (`# %%`) in
# VS Code / Jupyter. Without an accelerator it fakes 8 CPU devices.

# %%
import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import optax  # noqa: E402
from flax import nnx  # noqa: E402

from snnjax import parallel  # noqa: E402
from snnjax.models import Spikformer  # noqa: E402
from snnjax.train import apply_plan  # noqa: E402
from snnjax.train.step import StepConfig, TrainState, split_model  # noqa: E402

print(jax.device_count(), "devices:", jax.devices()[0].platform)

# %% [markdown]
# ## 1. What the model offers: neurons, parameters, tensor-parallel layers
# Every parameter carries logical names (`embed`, `mlp`, `heads`, `head_dim`, `qkv`, ...).
# The attention's fused q/k/v kernel is `[D, 3, heads, head_dim]`, so splitting `heads`
# never cuts a head in two.

# %%
model = Spikformer(T=2, img_size_h=32,
                   img_size_w=32, in_channels=2, num_classes=10, embed_dims=32, num_heads=4, depths=1,
                   mlp_ratio=2, rngs=nnx.Rngs(0))
info = parallel.analyze(model)
print(f"{info['num_params']:,} parameters, {len(info['neurons'])} neurons")
for layer in info["tp_layers"]:
    print(f"  {layer['role']:<7} {layer['layer']:<24} {layer['kernel_shape']}  {layer['logical_axes']}")

# %% [markdown]
# ## 2. A plan: FSDP over 4 devices x tensor parallelism over 2
# `print(plan)` lists each parameter's PartitionSpec as stored and in the optimizer, and its
# bytes per device, then the collectives the strategy implies.

# %%
mesh = parallel.make_mesh("fsdp=4,tensor=2")
plan = parallel.plan(model, mesh, mode="fsdp_tp")
print(plan)

# %% [markdown]
# ## 3. Apply it: shard the train state, get the jitted step

# %%
graphdef, params, rngs, rest = split_model(model)
tx = optax.adam(1e-3)
state = TrainState(step=jnp.zeros((), jnp.int32), params=params, rngs=rngs, model_state=rest,
                   opt_state=tx.init(params))
cfg = StepConfig(seed=0, time_steps=2, encoder=None)
state, step = apply_plan(plan, state, cfg, graphdef, tx)
print(parallel.describe_shardings(state.params, title="parameters as placed:"))

# %% [markdown]
# Which device holds which block of the MLP's first kernel (`[embed, mlp]`: fsdp splits
# `embed`, tensor splits `mlp`):

# %%
jax.debug.visualize_array_sharding(state.params["blocks"][0]["mlp"]["fc1"]["fc"]["kernel"][...])

# %% [markdown]
# ## 4. Change an annotation interactively and plan again
# Say we would rather keep the MLP whole under tensor parallelism (e.g. because its
# all-reduce costs more than it saves). Rename its `mlp` dims to `embed`; the plan follows.

# %%
mlp = model.blocks[0].mlp
for var in (mlp.fc1.fc.kernel, mlp.fc2.fc.kernel):
    parallel.annotate(var, "embed", "embed")
for var in (mlp.fc1.bn.scale, mlp.fc1.bn.bias, mlp.fc1.bn.mean, mlp.fc1.bn.var):
    parallel.annotate(var, "embed")
replanned = parallel.plan(model, mesh, mode="fsdp_tp")
for path in ("blocks.0.mlp.fc1.fc.kernel", "blocks.0.mlp.fc2.fc.kernel"):
    print(f"{path}: {plan.layout_of(path).param} -> {replanned.layout_of(path).param}")
print("parameter bytes per device:", plan.totals()["param_bytes_per_device"], "->",
      replanned.totals()["param_bytes_per_device"])

# %% [markdown]
# ## 5. One train step and what it cost
# Memory per device comes from the compiled step's `memory_analysis()`, collectives from
# its HLO (`compiled.as_text()`).

# %%
x = (jax.random.uniform(jax.random.key(1), (2, 8, 32, 32, 2)) < 0.3).astype(jnp.float32)
batch = {"inputs": jax.device_put(x, plan.batch_sharding(5, 1)),
         "labels": jax.device_put(jnp.arange(8) % 10, plan.batch_sharding(1, 0))}
compiled = step.lower(state, batch).compile()
state, metrics = compiled(state, batch)
print(f"loss {float(metrics['loss']):.4f}")
print(parallel.format_report(parallel.step_report(compiled, state)))
