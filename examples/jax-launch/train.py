"""A multi-process JAX training script that knows nothing of tessel.

Linear regression by SGD: every step's global batch (64 rows, drawn from
the step number) is split over every device of every process; each device
computes its gradient and `psum` sums them across processes (gloo on
CPU). Checkpoints every --every steps into $TESSEL_CHECKPOINT_DIR (or
--ckpt), and resumes from the newest step every process has.

    python3 train.py --steps 200           # one process, 4 CPU devices: the reference
    tessel local job.toml                  # 4 processes, one device each

Under tessel (or any launcher that sets JAX's coordinator address), the
one call it needs is the process count and index, which JAX 0.10 does not
read from the environment by itself:

    jax.distributed.initialize(num_processes=int(os.environ["JAX_NUM_PROCESSES"]),
                               process_id=int(os.environ["JAX_PROCESS_ID"]))
"""

import argparse
import glob
import os
import sys
import time

DEVICES = 4  # global devices, whatever the process count
ROWS, FEATURES, LR = 64, 8, 0.1

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=200)
p.add_argument("--every", type=int, default=20)
p.add_argument("--ckpt", default=os.environ.get("TESSEL_CHECKPOINT_DIR"))
p.add_argument("--step-sleep", type=float, default=0.0)
args = p.parse_args()

distributed = "JAX_COORDINATOR_ADDRESS" in os.environ
if not distributed:
    os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={DEVICES}"

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

jax.config.update("jax_platforms", "cpu")
if distributed:
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(
        num_processes=int(os.environ["JAX_NUM_PROCESSES"]),
        process_id=int(os.environ["JAX_PROCESS_ID"]),
    )
assert jax.device_count() == DEVICES, jax.devices()
rank, local_n = jax.process_index(), jax.local_device_count()
W_TRUE = np.linspace(-1.0, 1.0, FEATURES, dtype=np.float32)


def batch(step):
    """This process's shards of step `step`'s global batch."""
    rng = np.random.default_rng(step)
    x = rng.standard_normal((ROWS, FEATURES), dtype=np.float32)
    y = x @ W_TRUE + 0.01 * rng.standard_normal(ROWS, dtype=np.float32)
    per = ROWS // DEVICES
    first = rank * local_n
    xs = x.reshape(DEVICES, per, FEATURES)[first : first + local_n]
    ys = y.reshape(DEVICES, per)[first : first + local_n]
    return xs, ys


def grad(w, x, y):
    g = jax.grad(lambda w: jnp.mean((x @ w - y) ** 2))(w)
    loss = jnp.mean((x @ w - y) ** 2)
    return jax.lax.psum(g, "d") / DEVICES, jax.lax.psum(loss, "d") / DEVICES


step_fn = jax.pmap(grad, axis_name="d", in_axes=(None, 0, 0))
newest = jax.pmap(lambda s: jax.lax.pmin(s, "d"), axis_name="d")


def saved_steps():
    if not args.ckpt:
        return []
    files = glob.glob(os.path.join(args.ckpt, f"rank{rank}-*.npy"))
    return sorted(int(f.rsplit("-", 1)[1][:-4]) for f in files)


# Resume from the newest step every process holds (a process killed
# between two checkpoints may be one behind the others).
mine = saved_steps()
start = int(newest(np.full(local_n, mine[-1] if mine else 0, np.int32))[0])
if start > 0:
    w = np.load(os.path.join(args.ckpt, f"rank{rank}-{start}.npy"))
    print(f"resumed from step {start}", flush=True)
else:
    w = np.zeros(FEATURES, np.float32)
    print("starting from step 0", flush=True)

for step in range(start, args.steps):
    xs, ys = batch(step)
    g, loss = step_fn(w, xs, ys)
    w = (w - LR * np.asarray(g[0])).astype(np.float32)
    done = step + 1
    if args.ckpt and done % args.every == 0:
        os.makedirs(args.ckpt, exist_ok=True)
        tmp = os.path.join(args.ckpt, f".rank{rank}-{done}.tmp.npy")
        np.save(tmp, w)
        os.replace(tmp, os.path.join(args.ckpt, f"rank{rank}-{done}.npy"))
        for old in saved_steps()[:-3]:
            os.remove(os.path.join(args.ckpt, f"rank{rank}-{old}.npy"))
        print(f"step {done} loss {float(loss[0]):.6f} checkpointed", flush=True)
    time.sleep(args.step_sleep)

if rank == 0:
    print("final w " + " ".join(repr(float(v)) for v in w), flush=True)
sys.exit(0)
