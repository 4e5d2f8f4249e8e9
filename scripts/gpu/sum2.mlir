// A global program over two devices: each holds half of x, and the sum is
// an all-reduce between them (NCCL on GPUs). The GPU check runs it on one
// process whose plugin mocks a second node (enable_mock_nccl).
module @sum2 attributes {mhlo.num_partitions = 2 : i32, mhlo.num_replicas = 1 : i32} {
  func.func public @main(%arg0: tensor<8xf32> {mhlo.sharding = "{devices=[2]<=[2]}"}) -> (tensor<f32> {mhlo.sharding = "{replicated}"}) {
    %zero = stablehlo.constant dense<0.0> : tensor<f32>
    %0 = stablehlo.reduce(%arg0 init: %zero) applies stablehlo.add across dimensions = [0] : (tensor<8xf32>, tensor<f32>) -> tensor<f32>
    return %0 : tensor<f32>
  }
}
