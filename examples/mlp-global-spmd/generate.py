"""Regenerates the global-SPMD demo's training step with JAX (only needed to
regenerate; tessel never needs JAX at run time).

    python3 -m venv /tmp/jaxenv && /tmp/jaxenv/bin/pip install "jax[cpu]==0.10.2"
    /tmp/jaxenv/bin/python examples/mlp-global-spmd/generate.py

The model, data and learning rate are those of ../mlp-data-parallel (the
dataset is read from there). Here one program is the whole training step,
lowered once over a mesh `data=4`: parameters replicated, the batch's rows
split over `data`. XLA's SPMD partitioner turns the mean over the global
batch into a per-device partial mean and an all-reduce inside the program,
so a job runs it on every device at once and needs no `all_reduce` step.

    step.mlir      (w1, b1, w2, b2, x, y, t) -> (w1, b1, w2, b2, t + 1, loss, accuracy)
                   over data=4 (job.toml)
    step_1x1.mlir  the same step on one device (job-1x1.toml: the reference
                   for step time, with the arrays kept on the device too)
    step_2x1.mlir  over data=2, for two processes of one GPU each
                   (job-2x1-cuda.toml)

`t` is the step counter, carried on the device (no host scalar per step).
w1, b1, w2, b2 and t are donated: their buffers are reused for the results.
"""
import os

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "..", "mlp-data-parallel")
F, H, C = 16, 64, 4
BATCHES = 16
LR = 1.0
DEVICES = 4


def loss_acc(params, xb, yb):
    w1, b1, w2, b2 = params
    logits = jnp.tanh(xb @ w1 + b1) @ w2 + b2
    lse = jax.nn.logsumexp(logits, axis=-1)
    picked = jnp.take_along_axis(logits, yb[:, None], axis=-1)[:, 0]
    loss = jnp.mean(lse - picked)
    acc = jnp.mean((jnp.argmax(logits, axis=-1) == yb).astype(jnp.float32))
    return loss, acc


def step(w1, b1, w2, b2, x, y, t):
    i = t % BATCHES
    xb = jax.lax.dynamic_index_in_dim(x, i, 0, keepdims=False)
    yb = jax.lax.dynamic_index_in_dim(y, i, 0, keepdims=False)
    (loss, acc), g = jax.value_and_grad(loss_acc, has_aux=True)((w1, b1, w2, b2), xb, yb)
    new = [p - LR * d for p, d in zip((w1, b1, w2, b2), g)]
    return (*new, t + 1, loss, acc)


def lower(devices, x, y):
    mesh = Mesh(jax.devices()[:devices], ("data",))
    rep = NamedSharding(mesh, P())
    rows = NamedSharding(mesh, P(None, "data"))
    jitted = jax.jit(
        step,
        in_shardings=(rep,) * 4 + (rows, rows, rep),
        out_shardings=(rep,) * 7,
        donate_argnums=(0, 1, 2, 3, 6),
    )
    params = (
        np.zeros((F, H), np.float32),
        np.zeros((H,), np.float32),
        np.zeros((H, C), np.float32),
        np.zeros((C,), np.float32),
    )
    return jitted.lower(*params, x, y, np.int32(0)).as_text()


def main():
    x = np.load(os.path.join(DATA, "x.npy"))
    y = np.load(os.path.join(DATA, "y.npy"))
    for name, devices in [("step.mlir", DEVICES), ("step_1x1.mlir", 1), ("step_2x1.mlir", 2)]:
        with open(os.path.join(HERE, name), "w") as out:
            out.write(lower(devices, x, y))


if __name__ == "__main__":
    main()
