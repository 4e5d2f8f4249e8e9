module @jit_pow2 attributes {mhlo.num_partitions = 1 : i32, mhlo.num_replicas = 1 : i32} {
  func.func public @main(%arg0: tensor<i32>) -> (tensor<i32> {jax.result_info = "result[0]"}, tensor<i32> {jax.result_info = "result[1]"}) {
    %c = stablehlo.constant dense<1> : tensor<i32>
    %c_0 = stablehlo.constant dense<0> : tensor<i32>
    %0:3 = stablehlo.while(%iterArg = %arg0, %iterArg_1 = %c, %iterArg_2 = %c_0) : tensor<i32>, tensor<i32>, tensor<i32>
    cond {
      %1 = stablehlo.compare LT, %iterArg_1, %iterArg, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      stablehlo.return %1 : tensor<i1>
    } do {
      %c_3 = stablehlo.constant dense<2> : tensor<i32>
      %1 = stablehlo.multiply %iterArg_1, %c_3 : tensor<i32>
      %c_4 = stablehlo.constant dense<1> : tensor<i32>
      %2 = stablehlo.add %iterArg_2, %c_4 : tensor<i32>
      stablehlo.return %iterArg, %1, %2 : tensor<i32>, tensor<i32>, tensor<i32>
    }
    return %0#1, %0#2 : tensor<i32>, tensor<i32>
  }
}
