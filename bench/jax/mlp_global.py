"""The global MLP step in JAX on ONE process with N CPU devices, for `tessel
bench job --jax PYTHON examples/mlp-global-spmd/job.toml`: the same model,
learning rate, batches and layout as the global example (parameters
replicated, each batch's rows split over `data`, the gradient mean an
all-reduce inside the jitted step, parameters and step counter donated, the
dataset placed on the devices once) — what a JAX user runs on one host.
Runs WARMUP steps, then times STEPS steps and prints one JSON line.
EXTRA_XLA_FLAGS adds XLA flags.

Arguments: ADDRESS N I DATA_DIR STEPS WARMUP DEVICES (ADDRESS, N and I are
unused: one process).
"""
import json
import os
import sys
import time

data_dir, steps, warmup, devices = sys.argv[4], int(sys.argv[5]), int(sys.argv[6]), int(sys.argv[7])
os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices} " + os.environ.get("EXTRA_XLA_FLAGS", "")
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # noqa: E402

F, H, C, LR = 16, 64, 4, 1.0
x = np.load(os.path.join(data_dir, "x.npy"))
y = np.load(os.path.join(data_dir, "y.npy"))
batches = y.shape[0]
r = np.random.default_rng(1)
params = (
    (0.25 * r.normal(size=(F, H))).astype(np.float32),
    np.zeros((H,), np.float32),
    (0.125 * r.normal(size=(H, C))).astype(np.float32),
    np.zeros((C,), np.float32),
)


def loss_acc(p, xb, yb):
    w1, b1, w2, b2 = p
    logits = jnp.tanh(xb @ w1 + b1) @ w2 + b2
    lse = jax.nn.logsumexp(logits, axis=-1)
    picked = jnp.take_along_axis(logits, yb[:, None], axis=-1)[:, 0]
    acc = jnp.mean((jnp.argmax(logits, axis=-1) == yb).astype(jnp.float32))
    return jnp.mean(lse - picked), acc


def step(w1, b1, w2, b2, x, y, t):
    i = t % batches
    xb = jax.lax.dynamic_index_in_dim(x, i, 0, keepdims=False)
    yb = jax.lax.dynamic_index_in_dim(y, i, 0, keepdims=False)
    (loss, acc), g = jax.value_and_grad(loss_acc, has_aux=True)((w1, b1, w2, b2), xb, yb)
    new = [p - LR * d for p, d in zip((w1, b1, w2, b2), g)]
    return (*new, t + 1, loss, acc)


mesh = Mesh(jax.devices()[:devices], ("data",))
rep = NamedSharding(mesh, P())
rows = NamedSharding(mesh, P(None, "data"))
jstep = jax.jit(
    step,
    in_shardings=(rep,) * 4 + (rows, rows, rep),
    out_shardings=(rep,) * 7,
    donate_argnums=(0, 1, 2, 3, 6),
)
state = [jax.device_put(p, rep) for p in params] + [jax.device_put(np.int32(0), rep)]
xd, yd = jax.device_put(x, rows), jax.device_put(y, rows)
# Each step waits for the one before, as tessel's does: with several steps
# in flight, XLA's CPU runtime on two cores deadlocks in the all-reduce's
# rendezvous (every device thread of one step must arrive together).
for _ in range(warmup):
    *state, loss, acc = jstep(*state[:4], xd, yd, state[4])
    jax.block_until_ready(state)
t0 = time.perf_counter()
for _ in range(steps):
    *state, loss, acc = jstep(*state[:4], xd, yd, state[4])
    jax.block_until_ready(state)
elapsed = time.perf_counter() - t0
print(json.dumps({"step_ms": elapsed / steps * 1e3, "loss": float(loss), "accuracy": float(acc)}), flush=True)
