"""One process of a JAX all-reduce on CPU over gloo, for `tessel-bench
transfer --jax PYTHON`: sums COUNT f32 across the processes (one CPU device
each) REPEAT times after a warm-up and prints the time of each, as one JSON
line. The peer a user would otherwise pick for cross-process CPU
collectives."""
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
x = np.full((1, count), process_id + 1, dtype=np.float32)
want = num_processes * (num_processes + 1) / 2
out = psum(x)
out.block_until_ready()
assert float(out[0, 0]) == want, (float(out[0, 0]), want)
ms = []
for _ in range(repeat):
    x = np.full((1, count), process_id + 1, dtype=np.float32)
    # As tessel's ranks do: every input ready before the clock starts.
    multihost_utils.sync_global_devices("input ready")
    t = time.perf_counter()
    psum(x).block_until_ready()
    ms.append((time.perf_counter() - t) * 1e3)
print(json.dumps({"ms": ms}), flush=True)
jax.distributed.shutdown()
