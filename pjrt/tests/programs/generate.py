"""Regenerates the StableHLO test programs in this folder with JAX.

JAX is only needed to regenerate them; tests read the committed files.

    python3 -m venv /tmp/jaxenv && /tmp/jaxenv/bin/pip install "jax[cpu]==0.10.2"
    /tmp/jaxenv/bin/python pjrt/tests/programs/generate.py
"""
import os

import jax
import jax.numpy as jnp
from jax import lax

HERE = os.path.dirname(os.path.abspath(__file__))


def write(name, text):
    with open(os.path.join(HERE, name), "w" if isinstance(text, str) else "wb") as f:
        f.write(text)


def lower(f, *specs):
    return jax.jit(f).lower(*specs)


f32 = jnp.float32

# Elementwise add of two f32[2,2].
add = lower(lambda a, b: a + b, jax.ShapeDtypeStruct((2, 2), f32), jax.ShapeDtypeStruct((2, 2), f32))
write("add.mlir", add.as_text())

# Matrix product f32[2,3] x f32[3,2].
dot = lower(jnp.dot, jax.ShapeDtypeStruct((2, 3), f32), jax.ShapeDtypeStruct((3, 2), f32))
write("dot.mlir", dot.as_text())

# Sum and max over the rows of f32[3,4].
reduce = lower(lambda x: (jnp.sum(x, axis=1), jnp.max(x)), jax.ShapeDtypeStruct((3, 4), f32))
write("reduce_tuple.mlir", reduce.as_text())


# A while loop: the smallest power of two >= n, and the iteration count.
def pow2(n):
    def cond(c):
        return c[0] < n

    def body(c):
        return (c[0] * 2, c[1] + 1)

    return lax.while_loop(cond, body, (jnp.int32(1), jnp.int32(0)))


loop = lower(pow2, jax.ShapeDtypeStruct((), jnp.int32))
write("while.mlir", loop.as_text())

# The same add as MLIR bytecode and as a serialized HloModuleProto.
from jax._src.interpreters import mlir as jmlir  # noqa: E402

module = add.compiler_ir("stablehlo")
write("add.mlirbc", jmlir.module_to_bytecode(module))
write("add.hlo.pb", add.compiler_ir("hlo").as_serialized_hlo_module_proto())
print("jax", jax.__version__, "wrote", sorted(os.listdir(HERE)))

