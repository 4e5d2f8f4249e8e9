"""Regenerates spmd_sum_sdy.mlir (Shardy annotations) with JAX; see generate.py."""
import os

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
mesh = Mesh(jax.devices()[:4], ("x",))
f = jax.jit(jnp.sum, in_shardings=NamedSharding(mesh, P("x")), out_shardings=NamedSharding(mesh, P()))
text = f.lower(jax.ShapeDtypeStruct((8,), jnp.float32)).as_text()
with open(os.path.join(HERE, "spmd_sum_sdy.mlir"), "w") as out:
    out.write(text)
print(text)
