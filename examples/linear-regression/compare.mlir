// Compares the fitted weights with the ones that generated the data: returns
// the largest absolute difference, and the first and last training loss.
// Written by hand.
func.func public @main(%w: tensor<8xf32>, %w_true: tensor<8xf32>, %losses: tensor<200xf32>)
    -> (tensor<f32>, tensor<f32>, tensor<f32>) {
  %diff = stablehlo.subtract %w, %w_true : tensor<8xf32>
  %abs = stablehlo.abs %diff : tensor<8xf32>
  %ninf = stablehlo.constant dense<0xFF800000> : tensor<f32>
  %max = stablehlo.reduce(%abs init: %ninf) applies stablehlo.maximum across dimensions = [0]
      : (tensor<8xf32>, tensor<f32>) -> tensor<f32>
  %first = stablehlo.slice %losses [0:1] : (tensor<200xf32>) -> tensor<1xf32>
  %last = stablehlo.slice %losses [199:200] : (tensor<200xf32>) -> tensor<1xf32>
  %f = stablehlo.reshape %first : (tensor<1xf32>) -> tensor<f32>
  %l = stablehlo.reshape %last : (tensor<1xf32>) -> tensor<f32>
  return %max, %f, %l : tensor<f32>, tensor<f32>, tensor<f32>
}
