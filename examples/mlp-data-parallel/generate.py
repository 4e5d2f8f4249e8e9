"""Regenerates the demo's StableHLO programs and dataset with JAX (only
needed to regenerate; tessel never needs JAX at run time).

    python3 -m venv /tmp/jaxenv && /tmp/jaxenv/bin/pip install "jax[cpu]==0.10.2"
    /tmp/jaxenv/bin/python examples/mlp-data-parallel/generate.py

The model: a 2-layer MLP (16 → 64 tanh → 4) classifying points whose label
is the argmax of a random "teacher" network, all drawn from a fixed seed.

The dataset is stored batch-major, x: f32[16, 256, 16] (16 global batches of
256 rows) and y: s32[16, 256]; the job specs split dimension 1 (the rows of
each batch) over the `data` mesh axis. Step s trains on global batch s mod 16:
every process takes its rows of that batch, so the union over processes is
exactly the batch a single device would take.

Programs (one per process-local batch size, since shapes are static):
  grad_<layout>.mlir   (w1, b1, w2, b2, x_local, y_local, step) ->
                       f32[1350]: the flattened gradients of the local mean
                       cross-entropy, then the local loss and accuracy.
                       One flat vector, so one all-reduce per step.
  update.mlir          (w1, b1, w2, b2, g) -> (w1, b1, w2, b2, loss, accuracy):
                       SGD with the mean-all-reduced g.
Layouts: 1x1 (one device, batch 256), 4x1 (4 processes, 64 rows each),
2x2 (2 processes of 2 devices, 128 rows each, split over the 2 devices
by XLA's SPMD partitioner inside the program).
"""
import os
import sys

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
F, H, C = 16, 64, 4
BATCHES, BATCH = 16, 256
LR = float(os.environ.get("LR", "1.0"))
SIZES = [F * H, H, H * C, C]
SHAPES = [(F, H), (H,), (H, C), (C,)]
NPARAMS = sum(SIZES)

rng = np.random.default_rng(20261122)
x = rng.normal(size=(BATCHES, BATCH, F)).astype(np.float32)
t1 = rng.normal(size=(F, 32)).astype(np.float32)
t2 = rng.normal(size=(32, C)).astype(np.float32)
y = np.argmax(np.tanh(x @ t1) @ t2, axis=-1).astype(np.int32)


def loss_acc(params, xb, yb):
    w1, b1, w2, b2 = params
    logits = jnp.tanh(xb @ w1 + b1) @ w2 + b2
    lse = jax.nn.logsumexp(logits, axis=-1)
    picked = jnp.take_along_axis(logits, yb[:, None], axis=-1)[:, 0]
    loss = jnp.mean(lse - picked)
    acc = jnp.mean((jnp.argmax(logits, axis=-1) == yb).astype(jnp.float32))
    return loss, acc


def grad(w1, b1, w2, b2, x, y, step):
    i = step % BATCHES
    xb = jax.lax.dynamic_index_in_dim(x, i, 0, keepdims=False)
    yb = jax.lax.dynamic_index_in_dim(y, i, 0, keepdims=False)
    (loss, acc), g = jax.value_and_grad(loss_acc, has_aux=True)((w1, b1, w2, b2), xb, yb)
    return jnp.concatenate([t.ravel() for t in g] + [loss[None], acc[None]])


def update(w1, b1, w2, b2, g):
    out, at = [], 0
    for p, n, shape in zip((w1, b1, w2, b2), SIZES, SHAPES):
        out.append(p - LR * g[at : at + n].reshape(shape))
        at += n
    return (*out, g[NPARAMS], g[NPARAMS + 1])


def params0(seed=1):
    r = np.random.default_rng(seed)
    return (
        (0.25 * r.normal(size=(F, H))).astype(np.float32),
        np.zeros((H,), np.float32),
        (0.125 * r.normal(size=(H, C))).astype(np.float32),
        np.zeros((C,), np.float32),
    )


def write(name, lowered):
    with open(os.path.join(HERE, name), "w") as out:
        out.write(lowered.as_text())


def main():
    p = params0()
    step = np.int32(0)
    for layout, rows in [("1x1", BATCH), ("4x1", BATCH // 4)]:
        write(f"grad_{layout}.mlir", jax.jit(grad).lower(*p, x[:, :rows], y[:, :rows], step))
    mesh = Mesh(jax.devices()[:2], ("data",))
    rep = NamedSharding(mesh, P())
    split = NamedSharding(mesh, P(None, "data"))
    g2 = jax.jit(grad, in_shardings=(rep,) * 4 + (split, split, rep), out_shardings=rep)
    write("grad_2x2.mlir", g2.lower(*p, x[:, : BATCH // 2], y[:, : BATCH // 2], step))
    g = np.zeros((NPARAMS + 2,), np.float32)
    write("update.mlir", jax.jit(update).lower(*p, g))
    np.save(os.path.join(HERE, "x.npy"), x)
    np.save(os.path.join(HERE, "y.npy"), y)
    # How training goes with JAX on one device (own init; the job specs use
    # tessel's initialisers), to choose steps and learning rate.
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 300
    gj, uj = jax.jit(grad), jax.jit(update)
    for s in range(steps):
        *p, loss, acc = uj(*p, gj(*p, x, y, np.int32(s)))
        if (s + 1) % 50 == 0:
            print(f"jax step {s + 1}: loss {float(loss):.4f} accuracy {float(acc):.3f}")
    print("class balance", np.bincount(y.ravel(), minlength=C) / y.size)


if __name__ == "__main__":
    main()
