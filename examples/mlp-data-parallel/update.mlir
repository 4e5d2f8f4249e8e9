module @jit_update attributes {mhlo.num_partitions = 1 : i32, mhlo.num_replicas = 1 : i32} {
  func.func public @main(%arg0: tensor<16x64xf32>, %arg1: tensor<64xf32>, %arg2: tensor<64x4xf32>, %arg3: tensor<4xf32>, %arg4: tensor<1350xf32>) -> (tensor<16x64xf32> {jax.result_info = "result[0]"}, tensor<64xf32> {jax.result_info = "result[1]"}, tensor<64x4xf32> {jax.result_info = "result[2]"}, tensor<4xf32> {jax.result_info = "result[3]"}, tensor<f32> {jax.result_info = "result[4]"}, tensor<f32> {jax.result_info = "result[5]"}) {
    %0 = stablehlo.slice %arg4 [0:1024] : (tensor<1350xf32>) -> tensor<1024xf32>
    %1 = stablehlo.reshape %0 : (tensor<1024xf32>) -> tensor<16x64xf32>
    %cst = stablehlo.constant dense<1.000000e+00> : tensor<f32>
    %2 = stablehlo.broadcast_in_dim %cst, dims = [] : (tensor<f32>) -> tensor<16x64xf32>
    %3 = stablehlo.multiply %2, %1 : tensor<16x64xf32>
    %4 = stablehlo.subtract %arg0, %3 : tensor<16x64xf32>
    %5 = stablehlo.slice %arg4 [1024:1088] : (tensor<1350xf32>) -> tensor<64xf32>
    %cst_0 = stablehlo.constant dense<1.000000e+00> : tensor<f32>
    %6 = stablehlo.broadcast_in_dim %cst_0, dims = [] : (tensor<f32>) -> tensor<64xf32>
    %7 = stablehlo.multiply %6, %5 : tensor<64xf32>
    %8 = stablehlo.subtract %arg1, %7 : tensor<64xf32>
    %9 = stablehlo.slice %arg4 [1088:1344] : (tensor<1350xf32>) -> tensor<256xf32>
    %10 = stablehlo.reshape %9 : (tensor<256xf32>) -> tensor<64x4xf32>
    %cst_1 = stablehlo.constant dense<1.000000e+00> : tensor<f32>
    %11 = stablehlo.broadcast_in_dim %cst_1, dims = [] : (tensor<f32>) -> tensor<64x4xf32>
    %12 = stablehlo.multiply %11, %10 : tensor<64x4xf32>
    %13 = stablehlo.subtract %arg2, %12 : tensor<64x4xf32>
    %14 = stablehlo.slice %arg4 [1344:1348] : (tensor<1350xf32>) -> tensor<4xf32>
    %cst_2 = stablehlo.constant dense<1.000000e+00> : tensor<f32>
    %15 = stablehlo.broadcast_in_dim %cst_2, dims = [] : (tensor<f32>) -> tensor<4xf32>
    %16 = stablehlo.multiply %15, %14 : tensor<4xf32>
    %17 = stablehlo.subtract %arg3, %16 : tensor<4xf32>
    %18 = stablehlo.slice %arg4 [1348:1349] : (tensor<1350xf32>) -> tensor<1xf32>
    %19 = stablehlo.reshape %18 : (tensor<1xf32>) -> tensor<f32>
    %20 = stablehlo.slice %arg4 [1349:1350] : (tensor<1350xf32>) -> tensor<1xf32>
    %21 = stablehlo.reshape %20 : (tensor<1xf32>) -> tensor<f32>
    return %4, %8, %13, %17, %19, %21 : tensor<16x64xf32>, tensor<64xf32>, tensor<64x4xf32>, tensor<4xf32>, tensor<f32>, tensor<f32>
  }
}
