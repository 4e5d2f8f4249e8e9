module @jit_step attributes {mhlo.num_partitions = 2 : i32, mhlo.num_replicas = 1 : i32} {
  sdy.mesh @mesh = <["data"=2]> {stablehlo.mesh = {axes = [{name = "data", size = 2 : i64}]}}
  func.func public @main(%arg0: tensor<16x64xf32> {sdy.sharding = #sdy.sharding<@mesh, [{}, {}]>, tf.aliasing_output = 0 : i32}, %arg1: tensor<64xf32> {sdy.sharding = #sdy.sharding<@mesh, [{}]>, tf.aliasing_output = 1 : i32}, %arg2: tensor<64x4xf32> {sdy.sharding = #sdy.sharding<@mesh, [{}, {}]>, tf.aliasing_output = 2 : i32}, %arg3: tensor<4xf32> {sdy.sharding = #sdy.sharding<@mesh, [{}]>, tf.aliasing_output = 3 : i32}, %arg4: tensor<16x256x16xf32> {sdy.sharding = #sdy.sharding<@mesh, [{}, {"data"}, {}]>}, %arg5: tensor<16x256xi32> {sdy.sharding = #sdy.sharding<@mesh, [{}, {"data"}]>}, %arg6: tensor<i32> {sdy.sharding = #sdy.sharding<@mesh, []>, tf.aliasing_output = 4 : i32}) -> (tensor<16x64xf32> {jax.result_info = "result[0]", sdy.sharding = #sdy.sharding<@mesh, [{}, {}]>}, tensor<64xf32> {jax.result_info = "result[1]", sdy.sharding = #sdy.sharding<@mesh, [{}]>}, tensor<64x4xf32> {jax.result_info = "result[2]", sdy.sharding = #sdy.sharding<@mesh, [{}, {}]>}, tensor<4xf32> {jax.result_info = "result[3]", sdy.sharding = #sdy.sharding<@mesh, [{}]>}, tensor<i32> {jax.result_info = "result[4]", sdy.sharding = #sdy.sharding<@mesh, []>}, tensor<f32> {jax.result_info = "result[5]", sdy.sharding = #sdy.sharding<@mesh, []>}, tensor<f32> {jax.result_info = "result[6]", sdy.sharding = #sdy.sharding<@mesh, []>}) {
    %c = stablehlo.constant dense<16> : tensor<i32>
    %0 = call @remainder(%arg6, %c) : (tensor<i32>, tensor<i32>) -> tensor<i32>
    %1 = call @dynamic_index_in_dim(%arg4, %0) : (tensor<16x256x16xf32>, tensor<i32>) -> tensor<256x16xf32>
    %2 = call @dynamic_index_in_dim_0(%arg5, %0) : (tensor<16x256xi32>, tensor<i32>) -> tensor<256xi32>
    %3 = stablehlo.dot_general %1, %arg0, contracting_dims = [1] x [0], precision = [DEFAULT, DEFAULT] : (tensor<256x16xf32>, tensor<16x64xf32>) -> tensor<256x64xf32>
    %4 = stablehlo.broadcast_in_dim %arg1, dims = [1] : (tensor<64xf32>) -> tensor<1x64xf32>
    %5 = stablehlo.broadcast_in_dim %4, dims = [0, 1] : (tensor<1x64xf32>) -> tensor<256x64xf32>
    %6 = stablehlo.add %3, %5 : tensor<256x64xf32>
    %7 = stablehlo.tanh %6 : tensor<256x64xf32>
    %cst = stablehlo.constant dense<1.000000e+00> : tensor<f32>
    %8 = stablehlo.broadcast_in_dim %cst, dims = [] : (tensor<f32>) -> tensor<256x64xf32>
    %9 = stablehlo.subtract %8, %7 : tensor<256x64xf32>
    %10 = stablehlo.dot_general %7, %arg2, contracting_dims = [1] x [0], precision = [DEFAULT, DEFAULT] : (tensor<256x64xf32>, tensor<64x4xf32>) -> tensor<256x4xf32>
    %11 = stablehlo.broadcast_in_dim %arg3, dims = [1] : (tensor<4xf32>) -> tensor<1x4xf32>
    %12 = stablehlo.broadcast_in_dim %11, dims = [0, 1] : (tensor<1x4xf32>) -> tensor<256x4xf32>
    %13 = stablehlo.add %10, %12 : tensor<256x4xf32>
    %cst_0 = stablehlo.constant dense<0xFF800000> : tensor<f32>
    %14 = stablehlo.reduce(%13 init: %cst_0) applies stablehlo.maximum across dimensions = [1] : (tensor<256x4xf32>, tensor<f32>) -> tensor<256xf32>
    %cst_1 = stablehlo.constant dense<0xFF800000> : tensor<f32>
    %15 = stablehlo.broadcast_in_dim %cst_1, dims = [] : (tensor<f32>) -> tensor<256xf32>
    %16 = stablehlo.maximum %15, %14 : tensor<256xf32>
    %17 = stablehlo.is_finite %16 : (tensor<256xf32>) -> tensor<256xi1>
    %cst_2 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %18 = stablehlo.broadcast_in_dim %cst_2, dims = [] : (tensor<f32>) -> tensor<256xf32>
    %19 = stablehlo.select %17, %16, %18 : tensor<256xi1>, tensor<256xf32>
    %20 = stablehlo.broadcast_in_dim %19, dims = [0] : (tensor<256xf32>) -> tensor<256x1xf32>
    %21 = stablehlo.broadcast_in_dim %20, dims = [0, 1] : (tensor<256x1xf32>) -> tensor<256x4xf32>
    %22 = stablehlo.subtract %13, %21 : tensor<256x4xf32>
    %23 = stablehlo.exponential %22 : tensor<256x4xf32>
    %cst_3 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %24 = stablehlo.reduce(%23 init: %cst_3) applies stablehlo.add across dimensions = [1] : (tensor<256x4xf32>, tensor<f32>) -> tensor<256xf32>
    %25 = stablehlo.abs %24 : tensor<256xf32>
    %cst_4 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %26 = stablehlo.broadcast_in_dim %cst_4, dims = [] : (tensor<f32>) -> tensor<256xf32>
    %27 = stablehlo.compare GE, %24, %26, FLOAT : (tensor<256xf32>, tensor<256xf32>) -> tensor<256xi1>
    %28 = stablehlo.log %25 : tensor<256xf32>
    %29 = stablehlo.add %28, %19 : tensor<256xf32>
    %30 = stablehlo.broadcast_in_dim %2, dims = [0] : (tensor<256xi32>) -> tensor<256x1xi32>
    %31:2 = call @take_along_axis(%13, %30) : (tensor<256x4xf32>, tensor<256x1xi32>) -> (tensor<256x1xf32>, tensor<256x1x1xi32>)
    %32 = stablehlo.reshape %31#0 : (tensor<256x1xf32>) -> tensor<256xf32>
    %33 = stablehlo.subtract %29, %32 : tensor<256xf32>
    %cst_5 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %34 = stablehlo.reduce(%33 init: %cst_5) applies stablehlo.add across dimensions = [0] : (tensor<256xf32>, tensor<f32>) -> tensor<f32>
    %cst_6 = stablehlo.constant dense<2.560000e+02> : tensor<f32>
    %35 = stablehlo.divide %34, %cst_6 : tensor<f32>
    %36 = call @argmax(%13) : (tensor<256x4xf32>) -> tensor<256xi32>
    %37 = stablehlo.compare EQ, %36, %2, SIGNED : (tensor<256xi32>, tensor<256xi32>) -> tensor<256xi1>
    %38 = stablehlo.convert %37 : (tensor<256xi1>) -> tensor<256xf32>
    %cst_7 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %39 = stablehlo.reduce(%38 init: %cst_7) applies stablehlo.add across dimensions = [0] : (tensor<256xf32>, tensor<f32>) -> tensor<f32>
    %cst_8 = stablehlo.constant dense<2.560000e+02> : tensor<f32>
    %40 = stablehlo.divide %39, %cst_8 : tensor<f32>
    %cst_9 = stablehlo.constant dense<1.000000e+00> : tensor<f32>
    %cst_10 = stablehlo.constant dense<2.560000e+02> : tensor<f32>
    %41 = stablehlo.divide %cst_9, %cst_10 : tensor<f32>
    %42 = stablehlo.broadcast_in_dim %41, dims = [] : (tensor<f32>) -> tensor<256xf32>
    %43 = stablehlo.negate %42 : tensor<256xf32>
    %44 = stablehlo.broadcast_in_dim %43, dims = [0] : (tensor<256xf32>) -> tensor<256x1xf32>
    %45 = call @take_along_axis_1(%31#1, %44) : (tensor<256x1x1xi32>, tensor<256x1xf32>) -> tensor<256x4xf32>
    %46 = stablehlo.divide %42, %25 : tensor<256xf32>
    %cst_11 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %47 = stablehlo.broadcast_in_dim %cst_11, dims = [] : (tensor<f32>) -> tensor<256xf32>
    %48 = stablehlo.select %27, %47, %46 : tensor<256xi1>, tensor<256xf32>
    %49 = stablehlo.select %27, %46, %47 : tensor<256xi1>, tensor<256xf32>
    %50 = stablehlo.negate %48 : tensor<256xf32>
    %51 = stablehlo.add %49, %50 : tensor<256xf32>
    %52 = stablehlo.broadcast_in_dim %51, dims = [0] : (tensor<256xf32>) -> tensor<256x4xf32>
    %53 = stablehlo.multiply %52, %23 : tensor<256x4xf32>
    %54 = stablehlo.add %45, %53 : tensor<256x4xf32>
    %cst_12 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %55 = stablehlo.reduce(%54 init: %cst_12) applies stablehlo.add across dimensions = [0] : (tensor<256x4xf32>, tensor<f32>) -> tensor<4xf32>
    %56 = stablehlo.reshape %55 : (tensor<4xf32>) -> tensor<1x4xf32>
    %cst_13 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %57 = stablehlo.reduce(%56 init: %cst_13) applies stablehlo.add across dimensions = [0] : (tensor<1x4xf32>, tensor<f32>) -> tensor<4xf32>
    %58 = stablehlo.dot_general %54, %7, contracting_dims = [0] x [0], precision = [DEFAULT, DEFAULT] : (tensor<256x4xf32>, tensor<256x64xf32>) -> tensor<4x64xf32>
    %59 = stablehlo.transpose %58, dims = [1, 0] : (tensor<4x64xf32>) -> tensor<64x4xf32>
    %60 = stablehlo.dot_general %54, %arg2, contracting_dims = [1] x [1], precision = [DEFAULT, DEFAULT] : (tensor<256x4xf32>, tensor<64x4xf32>) -> tensor<256x64xf32>
    %61 = stablehlo.multiply %60, %9 : tensor<256x64xf32>
    %62 = stablehlo.multiply %61, %7 : tensor<256x64xf32>
    %63 = stablehlo.add %61, %62 : tensor<256x64xf32>
    %cst_14 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %64 = stablehlo.reduce(%63 init: %cst_14) applies stablehlo.add across dimensions = [0] : (tensor<256x64xf32>, tensor<f32>) -> tensor<64xf32>
    %65 = stablehlo.reshape %64 : (tensor<64xf32>) -> tensor<1x64xf32>
    %cst_15 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %66 = stablehlo.reduce(%65 init: %cst_15) applies stablehlo.add across dimensions = [0] : (tensor<1x64xf32>, tensor<f32>) -> tensor<64xf32>
    %67 = stablehlo.dot_general %63, %1, contracting_dims = [0] x [0], precision = [DEFAULT, DEFAULT] : (tensor<256x64xf32>, tensor<256x16xf32>) -> tensor<64x16xf32>
    %68 = stablehlo.transpose %67, dims = [1, 0] : (tensor<64x16xf32>) -> tensor<16x64xf32>
    %cst_16 = stablehlo.constant dense<1.000000e+00> : tensor<f32>
    %69 = stablehlo.broadcast_in_dim %cst_16, dims = [] : (tensor<f32>) -> tensor<16x64xf32>
    %70 = stablehlo.multiply %69, %68 : tensor<16x64xf32>
    %71 = stablehlo.subtract %arg0, %70 : tensor<16x64xf32>
    %cst_17 = stablehlo.constant dense<1.000000e+00> : tensor<f32>
    %72 = stablehlo.broadcast_in_dim %cst_17, dims = [] : (tensor<f32>) -> tensor<64xf32>
    %73 = stablehlo.multiply %72, %66 : tensor<64xf32>
    %74 = stablehlo.subtract %arg1, %73 : tensor<64xf32>
    %cst_18 = stablehlo.constant dense<1.000000e+00> : tensor<f32>
    %75 = stablehlo.broadcast_in_dim %cst_18, dims = [] : (tensor<f32>) -> tensor<64x4xf32>
    %76 = stablehlo.multiply %75, %59 : tensor<64x4xf32>
    %77 = stablehlo.subtract %arg2, %76 : tensor<64x4xf32>
    %cst_19 = stablehlo.constant dense<1.000000e+00> : tensor<f32>
    %78 = stablehlo.broadcast_in_dim %cst_19, dims = [] : (tensor<f32>) -> tensor<4xf32>
    %79 = stablehlo.multiply %78, %57 : tensor<4xf32>
    %80 = stablehlo.subtract %arg3, %79 : tensor<4xf32>
    %c_20 = stablehlo.constant dense<1> : tensor<i32>
    %81 = stablehlo.add %arg6, %c_20 : tensor<i32>
    return %71, %74, %77, %80, %81, %35, %40 : tensor<16x64xf32>, tensor<64xf32>, tensor<64x4xf32>, tensor<4xf32>, tensor<i32>, tensor<f32>, tensor<f32>
  }
  func.func private @remainder(%arg0: tensor<i32>, %arg1: tensor<i32>) -> tensor<i32> {
    %0 = stablehlo.convert %arg1 : tensor<i32>
    %c = stablehlo.constant dense<0> : tensor<i32>
    %1 = stablehlo.compare EQ, %0, %c, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
    %c_0 = stablehlo.constant dense<1> : tensor<i32>
    %2 = call @_where(%1, %c_0, %0) : (tensor<i1>, tensor<i32>, tensor<i32>) -> tensor<i32>
    %3 = stablehlo.remainder %arg0, %2 : tensor<i32>
    %c_1 = stablehlo.constant dense<0> : tensor<i32>
    %4 = stablehlo.compare NE, %3, %c_1, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
    %c_2 = stablehlo.constant dense<0> : tensor<i32>
    %5 = stablehlo.compare LT, %3, %c_2, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
    %c_3 = stablehlo.constant dense<0> : tensor<i32>
    %6 = stablehlo.compare LT, %2, %c_3, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
    %7 = stablehlo.compare NE, %5, %6, UNSIGNED : (tensor<i1>, tensor<i1>) -> tensor<i1>
    %8 = stablehlo.and %7, %4 : tensor<i1>
    %9 = stablehlo.add %3, %2 : tensor<i32>
    %10 = stablehlo.select %8, %9, %3 : tensor<i1>, tensor<i32>
    return %10 : tensor<i32>
  }
  func.func private @_where(%arg0: tensor<i1>, %arg1: tensor<i32>, %arg2: tensor<i32>) -> tensor<i32> {
    %0 = stablehlo.select %arg0, %arg1, %arg2 : tensor<i1>, tensor<i32>
    return %0 : tensor<i32>
  }
  func.func private @dynamic_index_in_dim(%arg0: tensor<16x256x16xf32>, %arg1: tensor<i32>) -> tensor<256x16xf32> {
    %c = stablehlo.constant dense<0> : tensor<i32>
    %0 = stablehlo.compare LT, %arg1, %c, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
    %c_0 = stablehlo.constant dense<16> : tensor<i32>
    %1 = stablehlo.add %arg1, %c_0 : tensor<i32>
    %2 = stablehlo.select %0, %1, %arg1 : tensor<i1>, tensor<i32>
    %c_1 = stablehlo.constant dense<0> : tensor<i32>
    %c_2 = stablehlo.constant dense<0> : tensor<i32>
    %3 = stablehlo.dynamic_slice %arg0, %2, %c_1, %c_2, sizes = [1, 256, 16] : (tensor<16x256x16xf32>, tensor<i32>, tensor<i32>, tensor<i32>) -> tensor<1x256x16xf32>
    %4 = stablehlo.reshape %3 : (tensor<1x256x16xf32>) -> tensor<256x16xf32>
    return %4 : tensor<256x16xf32>
  }
  func.func private @dynamic_index_in_dim_0(%arg0: tensor<16x256xi32>, %arg1: tensor<i32>) -> tensor<256xi32> {
    %c = stablehlo.constant dense<0> : tensor<i32>
    %0 = stablehlo.compare LT, %arg1, %c, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
    %c_0 = stablehlo.constant dense<16> : tensor<i32>
    %1 = stablehlo.add %arg1, %c_0 : tensor<i32>
    %2 = stablehlo.select %0, %1, %arg1 : tensor<i1>, tensor<i32>
    %c_1 = stablehlo.constant dense<0> : tensor<i32>
    %3 = stablehlo.dynamic_slice %arg0, %2, %c_1, sizes = [1, 256] : (tensor<16x256xi32>, tensor<i32>, tensor<i32>) -> tensor<1x256xi32>
    %4 = stablehlo.reshape %3 : (tensor<1x256xi32>) -> tensor<256xi32>
    return %4 : tensor<256xi32>
  }
  func.func private @take_along_axis(%arg0: tensor<256x4xf32>, %arg1: tensor<256x1xi32>) -> (tensor<256x1xf32>, tensor<256x1x1xi32>) {
    %c = stablehlo.constant dense<0> : tensor<i32>
    %0 = stablehlo.broadcast_in_dim %c, dims = [] : (tensor<i32>) -> tensor<256x1xi32>
    %1 = stablehlo.compare LT, %arg1, %0, SIGNED : (tensor<256x1xi32>, tensor<256x1xi32>) -> tensor<256x1xi1>
    %c_0 = stablehlo.constant dense<4> : tensor<i32>
    %2 = stablehlo.broadcast_in_dim %c_0, dims = [] : (tensor<i32>) -> tensor<256x1xi32>
    %3 = stablehlo.add %arg1, %2 : tensor<256x1xi32>
    %4 = stablehlo.select %1, %3, %arg1 : tensor<256x1xi1>, tensor<256x1xi32>
    %5 = stablehlo.reshape %4 : (tensor<256x1xi32>) -> tensor<256x1x1xi32>
    %c_1 = stablehlo.constant dense<3> : tensor<1xi32>
    %c_2 = stablehlo.constant dense<0> : tensor<i32>
    %6 = stablehlo.broadcast_in_dim %c_2, dims = [] : (tensor<i32>) -> tensor<256x1x1xi32>
    %7 = stablehlo.compare GE, %5, %6, SIGNED : (tensor<256x1x1xi32>, tensor<256x1x1xi32>) -> tensor<256x1x1xi1>
    %8 = stablehlo.broadcast_in_dim %c_1, dims = [2] : (tensor<1xi32>) -> tensor<1x1x1xi32>
    %9 = stablehlo.broadcast_in_dim %8, dims = [0, 1, 2] : (tensor<1x1x1xi32>) -> tensor<256x1x1xi32>
    %10 = stablehlo.compare LE, %5, %9, SIGNED : (tensor<256x1x1xi32>, tensor<256x1x1xi32>) -> tensor<256x1x1xi1>
    %11 = stablehlo.and %7, %10 : tensor<256x1x1xi1>
    %c_3 = stablehlo.constant dense<true> : tensor<i1>
    %12 = stablehlo.reduce(%11 init: %c_3) applies stablehlo.and across dimensions = [2] : (tensor<256x1x1xi1>, tensor<i1>) -> tensor<256x1xi1>
    %13 = "stablehlo.gather"(%arg0, %5) <{dimension_numbers = #stablehlo.gather<collapsed_slice_dims = [1], operand_batching_dims = [0], start_indices_batching_dims = [0], start_index_map = [1], index_vector_dim = 2>, indices_are_sorted = false, slice_sizes = array<i64: 1, 1>}> : (tensor<256x4xf32>, tensor<256x1x1xi32>) -> tensor<256x1xf32>
    %cst = stablehlo.constant dense<0x7FC00000> : tensor<f32>
    %14 = stablehlo.broadcast_in_dim %cst, dims = [] : (tensor<f32>) -> tensor<256x1xf32>
    %15 = stablehlo.select %12, %13, %14 : tensor<256x1xi1>, tensor<256x1xf32>
    return %15, %5 : tensor<256x1xf32>, tensor<256x1x1xi32>
  }
  func.func private @argmax(%arg0: tensor<256x4xf32>) -> tensor<256xi32> {
    %0 = stablehlo.iota dim = 1 : tensor<256x4xi32>
    %cst = stablehlo.constant dense<0xFF800000> : tensor<f32>
    %c = stablehlo.constant dense<0> : tensor<i32>
    %1:2 = stablehlo.reduce(%arg0 init: %cst), (%0 init: %c) across dimensions = [1] : (tensor<256x4xf32>, tensor<256x4xi32>, tensor<f32>, tensor<i32>) -> (tensor<256xf32>, tensor<256xi32>)
     reducer(%arg1: tensor<f32>, %arg3: tensor<f32>) (%arg2: tensor<i32>, %arg4: tensor<i32>)  {
      %2 = stablehlo.compare GT, %arg1, %arg3, FLOAT : (tensor<f32>, tensor<f32>) -> tensor<i1>
      %3 = stablehlo.compare NE, %arg1, %arg1, FLOAT : (tensor<f32>, tensor<f32>) -> tensor<i1>
      %4 = stablehlo.or %2, %3 : tensor<i1>
      %5 = stablehlo.compare EQ, %arg1, %arg3, FLOAT : (tensor<f32>, tensor<f32>) -> tensor<i1>
      %6 = stablehlo.compare LT, %arg2, %arg4, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      %7 = stablehlo.and %5, %6 : tensor<i1>
      %8 = stablehlo.or %4, %7 : tensor<i1>
      %9 = stablehlo.select %4, %arg1, %arg3 : tensor<i1>, tensor<f32>
      %10 = stablehlo.select %8, %arg2, %arg4 : tensor<i1>, tensor<i32>
      stablehlo.return %9, %10 : tensor<f32>, tensor<i32>
    }
    return %1#1 : tensor<256xi32>
  }
  func.func private @take_along_axis_1(%arg0: tensor<256x1x1xi32>, %arg1: tensor<256x1xf32>) -> tensor<256x4xf32> {
    %cst = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %0 = stablehlo.broadcast_in_dim %cst, dims = [] : (tensor<f32>) -> tensor<256x4xf32>
    %1 = "stablehlo.scatter"(%0, %arg0, %arg1) <{indices_are_sorted = false, scatter_dimension_numbers = #stablehlo.scatter<inserted_window_dims = [1], input_batching_dims = [0], scatter_indices_batching_dims = [0], scatter_dims_to_operand_dims = [1], index_vector_dim = 2>, unique_indices = false}> ({
    ^bb0(%arg2: tensor<f32>, %arg3: tensor<f32>):
      %2 = stablehlo.add %arg2, %arg3 : tensor<f32>
      stablehlo.return %2 : tensor<f32>
    }) : (tensor<256x4xf32>, tensor<256x1x1xi32>, tensor<256x1xf32>) -> tensor<256x4xf32>
    return %1 : tensor<256x4xf32>
  }
}
