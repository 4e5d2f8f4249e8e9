"""Regenerates train.mlir and its data with JAX (only needed to regenerate;
tessel never needs JAX at run time).

    python3 -m venv /tmp/jaxenv && /tmp/jaxenv/bin/pip install "jax[cpu]==0.10.2"
    /tmp/jaxenv/bin/python examples/linear-regression/generate.py

train.mlir fits y = x·w with 200 steps of full-batch gradient descent in a
single SPMD program. The batch of 256 rows is split over 4 devices along a
`data` mesh axis; the loss and gradient means are all-reduces that XLA's
partitioner inserts. Outputs: the fitted w and the loss before each step.
"""
import os

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
STEPS, LR, BATCH, FEATURES = 200, 0.1, 256, 8

rng = np.random.default_rng(20261122)
w_true = rng.normal(size=(FEATURES,)).astype(np.float32)
x = rng.normal(size=(BATCH, FEATURES)).astype(np.float32)
y = (x @ w_true + 0.01 * rng.normal(size=(BATCH,))).astype(np.float32)
w0 = np.zeros((FEATURES,), np.float32)


def train(w, x, y):
    def loss_fn(w):
        return jnp.mean((x @ w - y) ** 2)

    def step(i, carry):
        w, losses = carry
        loss, grad = jax.value_and_grad(loss_fn)(w)
        return w - LR * grad, losses.at[i].set(loss)

    return jax.lax.fori_loop(0, STEPS, step, (w, jnp.zeros((STEPS,), jnp.float32)))


mesh = Mesh(jax.devices()[:4], ("data",))
rep = NamedSharding(mesh, P())
f = jax.jit(
    train,
    in_shardings=(rep, NamedSharding(mesh, P("data", None)), NamedSharding(mesh, P("data"))),
    out_shardings=(rep, rep),
)
with open(os.path.join(HERE, "train.mlir"), "w") as out:
    out.write(f.lower(w0, x, y).as_text())
for name, arr in [("w0", w0), ("x", x), ("y", y), ("w_true", w_true)]:
    np.save(os.path.join(HERE, f"{name}.npy"), arr)
w, losses = f(w0, x, y)
print("jax: first loss", float(losses[0]), "last loss", float(losses[-1]))
print("jax: w", np.asarray(w))
print("true w", w_true)
