// Sum of an f32[8] vector split in 4 shards over 4 partitions; the result is
// replicated, so the SPMD partitioner inserts an all-reduce across devices.
// Written by hand with GSPMD (mhlo.sharding) annotations.
module @spmd_sum attributes {mhlo.num_partitions = 4 : i32, mhlo.num_replicas = 1 : i32} {
  func.func public @main(%arg0: tensor<8xf32> {mhlo.sharding = "{devices=[4]<=[4]}"}) -> (tensor<f32> {mhlo.sharding = "{replicated}"}) {
    %zero = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %sum = stablehlo.reduce(%arg0 init: %zero) applies stablehlo.add across dimensions = [0] : (tensor<8xf32>, tensor<f32>) -> tensor<f32>
    return %sum : tensor<f32>
  }
}
