"""One process of the MLP demo in JAX on CPU over gloo, for `tessel-bench
job --jax PYTHON`: the model, learning rate, data layout and global batch of
examples/mlp-data-parallel/job.toml, data-parallel across the processes
(one CPU device each) with `pmap` and one `pmean` of a flat vector of the
gradients, loss and accuracy per step — the peer a user would otherwise
pick. Runs WARMUP steps, then times STEPS steps and prints one JSON line.

Arguments: ADDRESS N I DATA_DIR STEPS WARMUP
"""
import json
import os
import sys
import time

address, num_processes, process_id = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
data_dir, steps, warmup = sys.argv[4], int(sys.argv[5]), int(sys.argv[6])
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.distributed.initialize(
    coordinator_address=address, num_processes=num_processes, process_id=process_id
)
F, H, C, LR = 16, 64, 4, 1.0
x = np.load(os.path.join(data_dir, "x.npy"))
y = np.load(os.path.join(data_dir, "y.npy"))
batches, batch = y.shape
rows = batch // num_processes
xl = x[None, :, process_id * rows : (process_id + 1) * rows]
yl = y[None, :, process_id * rows : (process_id + 1) * rows]
r = np.random.default_rng(1)
params = (
    (0.25 * r.normal(size=(1, F, H))).astype(np.float32),
    np.zeros((1, H), np.float32),
    (0.125 * r.normal(size=(1, H, C))).astype(np.float32),
    np.zeros((1, C), np.float32),
)


def loss_acc(p, xb, yb):
    w1, b1, w2, b2 = p
    logits = jnp.tanh(xb @ w1 + b1) @ w2 + b2
    lse = jax.nn.logsumexp(logits, axis=-1)
    picked = jnp.take_along_axis(logits, yb[:, None], axis=-1)[:, 0]
    acc = jnp.mean((jnp.argmax(logits, axis=-1) == yb).astype(jnp.float32))
    return jnp.mean(lse - picked), acc


def step(p, x, y, s):
    i = s % batches
    xb = jax.lax.dynamic_index_in_dim(x, i, 0, keepdims=False)
    yb = jax.lax.dynamic_index_in_dim(y, i, 0, keepdims=False)
    (loss, acc), g = jax.value_and_grad(loss_acc, has_aux=True)(p, xb, yb)
    flat = jax.lax.pmean(jnp.concatenate([t.ravel() for t in g] + [loss[None], acc[None]]), "i")
    out, at = [], 0
    for t in p:
        out.append(t - LR * flat[at : at + t.size].reshape(t.shape))
        at += t.size
    return tuple(out), flat[-2], flat[-1]


pstep = jax.pmap(step, axis_name="i")
s = np.zeros((1,), np.int32)
for k in range(warmup):
    params, loss, acc = pstep(params, xl, yl, s + k)
jax.block_until_ready(params)
t = time.perf_counter()
for k in range(warmup, warmup + steps):
    params, loss, acc = pstep(params, xl, yl, s + k)
jax.block_until_ready(params)
elapsed = time.perf_counter() - t
print(
    json.dumps(
        {"step_ms": elapsed / steps * 1e3, "loss": float(loss[0]), "accuracy": float(acc[0])}
    ),
    flush=True,
)
jax.distributed.shutdown()
