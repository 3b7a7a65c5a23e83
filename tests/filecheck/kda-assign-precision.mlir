// RUN: kdagen opt %s -p 'kda-assign-precision' | filecheck %s
// RUN: kdagen opt %s -p 'kda-assign-precision{products=bf16x3}' | filecheck %s --check-prefix=EXACT

// auto: TF32 for the products and the decay product, bf16x3 for the adjoint decay product
// (its differences are what the gate-parameter gradients sum).
// CHECK-LABEL: func.func @products
// CHECK:         "kda.dot"
// CHECK-SAME:      kda.precision = "tf32"
// CHECK:         "kda.decay_dot"
// CHECK-SAME:      kda.precision = "tf32"
// CHECK:         "kda.decay_matmul"
// CHECK-SAME:      kda.precision = "bf16x3"
// CHECK-NOT:     kda.precision
// EXACT-LABEL: func.func @products
// EXACT-COUNT-3: kda.precision = "bf16x3"
// EXACT-NOT:     kda.precision = "tf32"
// Gates that are one value per row broadcast over d (GDN's after kda-narrow-broadcasts): the
// adjoint decay product takes tf32x3 (its gate-gradient terms go through the tensor cores whole);
// the decay product keeps TF32.
// CHECK-LABEL: func.func @row_gates
// CHECK:         "kda.decay_dot"
// CHECK-SAME:      kda.precision = "tf32"
// CHECK:         "kda.decay_matmul"
// CHECK-SAME:      kda.precision = "tf32x3"
// EXACT-LABEL: func.func @row_gates
// EXACT-COUNT-2: kda.precision = "bf16x3"
// A kernel that stores per-chunk partial sums of a per-head gradient (a workspace that
// kda.sum_chunks reads: the gate parameters' dA_log, ddt_bias) takes bf16x3 for its plain
// products; another kernel keeps TF32.
// CHECK-LABEL: func.func @gate_gradient_kernel
// CHECK:         "kda.dot"
// CHECK-SAME:      kda.precision = "bf16x3"
// CHECK:         kda.kernel = "sums"
// CHECK:         "kda.dot"
// CHECK-SAME:      kda.precision = "tf32"
// CHECK:         kda.kernel = "other"
// EXACT-LABEL: func.func @gate_gradient_kernel
// EXACT-COUNT-2: kda.precision = "bf16x3"
module {
  func.func @products(%a: tensor<4x8xf32>, %b: tensor<4x8xf32>, %g: tensor<4x8xf32>, %w: tensor<4x4xf32>) -> (tensor<4x4xf32>, tensor<4x4xf32>, tensor<4x8xf32>) {
    %p = "kda.dot"(%a, %b) {transpose_lhs = false, transpose_rhs = true} : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x4xf32>
    %d = "kda.decay_dot"(%a, %b, %g, %g) {diagonal = 0 : i64, exact_diagonal = false, subblock = 1 : i64} : (tensor<4x8xf32>, tensor<4x8xf32>, tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x4xf32>
    %m = "kda.decay_matmul"(%w, %a, %g, %g) {diagonal = 0 : i64, exact_diagonal = false, subblock = 1 : i64, transpose = false} : (tensor<4x4xf32>, tensor<4x8xf32>, tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
    %s = "kda.add"(%p, %d) : (tensor<4x4xf32>, tensor<4x4xf32>) -> tensor<4x4xf32>
    return %s, %d, %m : tensor<4x4xf32>, tensor<4x4xf32>, tensor<4x8xf32>
  }
  func.func @row_gates(%a: tensor<4x8xf32>, %b: tensor<4x8xf32>, %g1: tensor<4xf32>, %w: tensor<4x4xf32>) -> (tensor<4x4xf32>, tensor<4x8xf32>) {
    %g = "kda.broadcast"(%g1) {dims = array<i64: 1>} : (tensor<4xf32>) -> tensor<4x8xf32>
    %d = "kda.decay_dot"(%a, %b, %g, %g) {diagonal = 0 : i64, exact_diagonal = false, subblock = 1 : i64} : (tensor<4x8xf32>, tensor<4x8xf32>, tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x4xf32>
    %m = "kda.decay_matmul"(%w, %a, %g, %g) {diagonal = 0 : i64, exact_diagonal = false, subblock = 1 : i64, transpose = false} : (tensor<4x4xf32>, tensor<4x8xf32>, tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
    return %d, %m : tensor<4x4xf32>, tensor<4x8xf32>
  }
  func.func @gate_gradient_kernel(%a: tensor<4x8xf32>, %b: tensor<4x8xf32>) -> tensor<f32> {
    %ws = "kda.workspace"() {layout = "chunk", name = "dA_log_h_chunks"} : () -> memref<?x?xf32>
    %other = "kda.workspace"() {layout = "chunk", name = "p_ws"} : () -> memref<?x?x4x4xf32>
    "kda.scan"() ({
    ^bb0(%c: index):
      %p = "kda.dot"(%a, %b) {transpose_lhs = false, transpose_rhs = true} : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x4xf32>
      %s = "kda.reduce_sum"(%p) {dims = array<i64: 0, 1>} : (tensor<4x4xf32>) -> tensor<f32>
      "kda.store_chunk"(%ws, %c, %s) {name = "dA_log_h"} : (memref<?x?xf32>, index, tensor<f32>) -> ()
      gpu.yield
    }) {kda.kernel = "sums", parallel = true, reverse = false} : () -> ()
    "kda.scan"() ({
    ^bb0(%c: index):
      %p = "kda.dot"(%a, %b) {transpose_lhs = false, transpose_rhs = true} : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x4xf32>
      "kda.store_chunk"(%other, %c, %p) {name = "p"} : (memref<?x?x4x4xf32>, index, tensor<4x4xf32>) -> ()
      gpu.yield
    }) {kda.kernel = "other", parallel = true, reverse = false} : () -> ()
    %t = "kda.sum_chunks"(%ws) {name = "dA_log_h"} : (memref<?x?xf32>) -> tensor<f32>
    return %t : tensor<f32>
  }
}
