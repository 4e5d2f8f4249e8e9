"""One process of `jax.distributed.initialize` on CPU, for `tessel-bench
bootstrap --jax PYTHON`: prints when `import jax` finished and when the
global device list was known (unix ms), as one JSON line."""
import json
import sys
import time

address, num_processes, process_id = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
started = time.time()
import jax  # noqa: E402

jax.config.update("jax_cpu_collectives_implementation", "gloo")
imported = time.time()
jax.distributed.initialize(
    coordinator_address=address, num_processes=num_processes, process_id=process_id
)
devices = jax.devices()
known = time.time()
print(
    json.dumps(
        {
            "imported_unix_ms": imported * 1e3,
            "known_unix_ms": known * 1e3,
            "devices": len(devices),
        }
    ),
    flush=True,
)
jax.distributed.shutdown()
