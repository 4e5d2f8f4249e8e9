"""One process of a JAX all-reduce on CPU over gloo, for `tessel-bench
transfer --jax PYTHON`: sums COUNT f32 across the processes (one CPU device
each) REPEAT times after a warm-up and prints the time of each, as one JSON
line. The peer a user would otherwise pick for cross-process CPU
collectives.

Two methods, both timed per call after a barrier that follows every
process's input being ready, as tessel's ranks are:
* "ms": the fair peer. The input is placed on the device once, and every
  call sums that same device array, as tessel's ranks sum the buffers they
  already hold.
* "ms_host_input": each call hands `pmap` a fresh host array, so the call
  includes copying COUNT f32 to the device (how this bench measured before).
"""
import json
import sys
import time

address, num_processes, process_id = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
count, repeat = int(sys.argv[4]), int(sys.argv[5])
import jax  # noqa: E402
import numpy as np  # noqa: E402
from jax.experimental import multihost_utils  # noqa: E402

jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.distributed.initialize(
    coordinator_address=address, num_processes=num_processes, process_id=process_id
)
psum = jax.pmap(lambda x: jax.lax.psum(x, "i"), axis_name="i")
want = num_processes * (num_processes + 1) / 2


def host_input():
    return np.full((1, count), process_id + 1, dtype=np.float32)


# On the device once: the identity under pmap leaves its result there.
on_device = jax.pmap(lambda x: x)(host_input())
on_device.block_until_ready()
for x in (on_device, host_input()):
    out = psum(x)
    out.block_until_ready()
    assert float(out[0, 0]) == want, (float(out[0, 0]), want)


def timed(make_input):
    ms = []
    for _ in range(repeat):
        x = make_input()
        multihost_utils.sync_global_devices("input ready")
        t = time.perf_counter()
        psum(x).block_until_ready()
        ms.append((time.perf_counter() - t) * 1e3)
    return ms


fair = timed(lambda: on_device)
host = timed(host_input)
print(json.dumps({"ms": fair, "ms_host_input": host}), flush=True)
jax.distributed.shutdown()
