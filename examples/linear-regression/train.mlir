module @jit_train attributes {mhlo.num_partitions = 4 : i32, mhlo.num_replicas = 1 : i32} {
  sdy.mesh @mesh = <["data"=4]> {stablehlo.mesh = {axes = [{name = "data", size = 4 : i64}]}}
  func.func public @main(%arg0: tensor<8xf32> {sdy.sharding = #sdy.sharding<@mesh, [{}]>}, %arg1: tensor<256x8xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"data"}, {}]>}, %arg2: tensor<256xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"data"}]>}) -> (tensor<8xf32> {jax.result_info = "result[0]", sdy.sharding = #sdy.sharding<@mesh, [{}]>}, tensor<200xf32> {jax.result_info = "result[1]", sdy.sharding = #sdy.sharding<@mesh, [{}]>}) {
    %cst = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %0 = stablehlo.broadcast_in_dim %cst, dims = [] : (tensor<f32>) -> tensor<200xf32>
    %c = stablehlo.constant dense<0> : tensor<i32>
    %c_0 = stablehlo.constant dense<0> : tensor<i32>
    %1:6 = stablehlo.while(%iterArg = %arg1, %iterArg_1 = %arg2, %iterArg_2 = %c_0, %iterArg_3 = %c, %iterArg_4 = %arg0, %iterArg_5 = %0) : tensor<256x8xf32>, tensor<256xf32>, tensor<i32>, tensor<i32>, tensor<8xf32>, tensor<200xf32>
    cond {
      %c_6 = stablehlo.constant dense<200> : tensor<i32>
      %2 = stablehlo.compare LT, %iterArg_2, %c_6, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      stablehlo.return %2 : tensor<i1>
    } do {
      %2:3 = func.call @closed_call(%iterArg, %iterArg_1, %iterArg_3, %iterArg_4, %iterArg_5) : (tensor<256x8xf32>, tensor<256xf32>, tensor<i32>, tensor<8xf32>, tensor<200xf32>) -> (tensor<i32>, tensor<8xf32>, tensor<200xf32>)
      %c_6 = stablehlo.constant dense<1> : tensor<i32>
      %3 = stablehlo.add %iterArg_2, %c_6 : tensor<i32>
      stablehlo.return %iterArg, %iterArg_1, %3, %2#0, %2#1, %2#2 : tensor<256x8xf32>, tensor<256xf32>, tensor<i32>, tensor<i32>, tensor<8xf32>, tensor<200xf32>
    }
    return %1#4, %1#5 : tensor<8xf32>, tensor<200xf32>
  }
  func.func private @closed_call(%arg0: tensor<256x8xf32>, %arg1: tensor<256xf32>, %arg2: tensor<i32>, %arg3: tensor<8xf32>, %arg4: tensor<200xf32>) -> (tensor<i32>, tensor<8xf32>, tensor<200xf32>) {
    %c = stablehlo.constant dense<1> : tensor<i32>
    %0 = stablehlo.add %arg2, %c : tensor<i32>
    %1 = stablehlo.dot_general %arg0, %arg3, contracting_dims = [1] x [0], precision = [DEFAULT, DEFAULT] : (tensor<256x8xf32>, tensor<8xf32>) -> tensor<256xf32>
    %2 = stablehlo.subtract %1, %arg1 : tensor<256xf32>
    %3 = stablehlo.multiply %2, %2 : tensor<256xf32>
    %cst = stablehlo.constant dense<2.000000e+00> : tensor<f32>
    %4 = stablehlo.broadcast_in_dim %cst, dims = [] : (tensor<f32>) -> tensor<256xf32>
    %5 = stablehlo.multiply %4, %2 : tensor<256xf32>
    %cst_0 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %6 = stablehlo.reduce(%3 init: %cst_0) applies stablehlo.add across dimensions = [0] : (tensor<256xf32>, tensor<f32>) -> tensor<f32>
    %cst_1 = stablehlo.constant dense<2.560000e+02> : tensor<f32>
    %7 = stablehlo.divide %6, %cst_1 : tensor<f32>
    %cst_2 = stablehlo.constant dense<1.000000e+00> : tensor<f32>
    %cst_3 = stablehlo.constant dense<2.560000e+02> : tensor<f32>
    %8 = stablehlo.divide %cst_2, %cst_3 : tensor<f32>
    %9 = stablehlo.broadcast_in_dim %8, dims = [] : (tensor<f32>) -> tensor<256xf32>
    %10 = stablehlo.multiply %9, %5 : tensor<256xf32>
    %11 = stablehlo.dot_general %10, %arg0, contracting_dims = [0] x [0], precision = [DEFAULT, DEFAULT] : (tensor<256xf32>, tensor<256x8xf32>) -> tensor<8xf32>
    %cst_4 = stablehlo.constant dense<1.000000e-01> : tensor<f32>
    %12 = stablehlo.broadcast_in_dim %cst_4, dims = [] : (tensor<f32>) -> tensor<8xf32>
    %13 = stablehlo.multiply %12, %11 : tensor<8xf32>
    %14 = stablehlo.subtract %arg3, %13 : tensor<8xf32>
    %c_5 = stablehlo.constant dense<0> : tensor<i32>
    %15 = stablehlo.compare LT, %arg2, %c_5, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
    %c_6 = stablehlo.constant dense<200> : tensor<i32>
    %16 = stablehlo.add %arg2, %c_6 : tensor<i32>
    %17 = stablehlo.select %15, %16, %arg2 : tensor<i1>, tensor<i32>
    %18 = stablehlo.convert %17 : tensor<i32>
    %19 = stablehlo.broadcast_in_dim %18, dims = [] : (tensor<i32>) -> tensor<1xi32>
    %20 = "stablehlo.scatter"(%arg4, %19, %7) <{indices_are_sorted = true, scatter_dimension_numbers = #stablehlo.scatter<inserted_window_dims = [0], scatter_dims_to_operand_dims = [0]>, unique_indices = true}> ({
    ^bb0(%arg5: tensor<f32>, %arg6: tensor<f32>):
      stablehlo.return %arg6 : tensor<f32>
    }) : (tensor<200xf32>, tensor<1xi32>, tensor<f32>) -> tensor<200xf32>
    return %0, %14, %20 : tensor<i32>, tensor<8xf32>, tensor<200xf32>
  }
}
