// RUN: kdagen opt %s -p 'kda-fold-row-decay' | filecheck %s

// Two adjoints of one row-gate decay product (GDN's dk kernel): decay_matmul(w, x, G, G) and
// its transpose, with G a broadcast of one value per row. The pass builds the [4, 4] weights
// E = 2^(g_i - g_j) once, saturating (masked) entries at the product's bound, weights and
// masks w once, tril(w ⊙ E, -1), and runs both products as plain dots that keep the decay
// product's precision.
// CHECK-LABEL: func.func @row_gates
// CHECK:         %[[GI:.*]] = "kda.broadcast"(%g) {dims = array<i64: 1>} : (tensor<4xf32>) -> tensor<4x4xf32>
// CHECK-NEXT:    %[[GJ:.*]] = "kda.broadcast"(%g) {dims = array<i64: 0>} : (tensor<4xf32>) -> tensor<4x4xf32>
// CHECK-NEXT:    %[[D:.*]] = "kda.sub"(%[[GI]], %[[GJ]])
// CHECK-NEXT:    %[[E:.*]] = "kda.exp2"(%[[D]]) {clamp_max = 1.260000e+02 : f64, clamp_min = -1.260000e+02 : f64, exp_bound = 1.260000e+02 : f64, exp_proof = "kept entries {{.*}}"}
// CHECK-NEXT:    %[[M:.*]] = "kda.mul"(%w, %[[E]]) : (tensor<4x4xf32>, tensor<4x4xf32>) -> tensor<4x4xf32>
// CHECK-NEXT:    %[[W:.*]] = "kda.tril"(%[[M]]) {diagonal = -1 : i64} : (tensor<4x4xf32>) -> tensor<4x4xf32>
// CHECK-NEXT:    %[[A:.*]] = "kda.dot"(%[[W]], %x) {kda.precision = "tf32x3", transpose_lhs = false, transpose_rhs = false} : (tensor<4x4xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
// CHECK-NEXT:    %[[B:.*]] = "kda.dot"(%[[W]], %x) {kda.precision = "tf32x3", transpose_lhs = true, transpose_rhs = false} : (tensor<4x4xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
// CHECK-NEXT:    "kda.add"(%[[A]], %[[B]])
// CHECK-NOT:     "kda.decay_matmul"
module {
  func.func @row_gates(%wm: memref<?x?x?x4xf32> {kda.layout = "token", kda.name = "w", kda.role = "input"}, %xm: memref<?x?x?x8xf32> {kda.layout = "token", kda.name = "x", kda.role = "input"}, %gm: memref<?x?x?xf32> {kda.layout = "token", kda.name = "g", kda.role = "input"}, %om: memref<?x?x?x8xf32> {kda.layout = "token", kda.name = "o", kda.role = "output"}) attributes {kda.chunk_size = 4 : i64, kda.program = "row_gates"} {
    "kda.scan"() ({
    ^bb0(%c: index):
      %w = "kda.load"(%wm, %c) {head_map = "direct", name = "w"} : (memref<?x?x?x4xf32>, index) -> tensor<4x4xf32>
      %x = "kda.load"(%xm, %c) {head_map = "direct", name = "x"} : (memref<?x?x?x8xf32>, index) -> tensor<4x8xf32>
      %g = "kda.load"(%gm, %c) {head_map = "direct", name = "g"} : (memref<?x?x?xf32>, index) -> tensor<4xf32>
      %G = "kda.broadcast"(%g) {dims = array<i64: 1>} : (tensor<4xf32>) -> tensor<4x8xf32>
      %a = "kda.decay_matmul"(%w, %x, %G, %G) {clamp_min = -1.260000e+02 : f64, diagonal = -1 : i64, exact_diagonal = true, exp_bound = 1.260000e+02 : f64, exp_proof = "gamma_i - gamma_j <= 0", kda.precision = "tf32x3", subblock = 16 : i64, transpose = false} : (tensor<4x4xf32>, tensor<4x8xf32>, tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
      %b = "kda.decay_matmul"(%w, %x, %G, %G) {clamp_min = -1.260000e+02 : f64, diagonal = -1 : i64, exact_diagonal = true, exp_bound = 1.260000e+02 : f64, exp_proof = "gamma_i - gamma_j <= 0", kda.precision = "tf32x3", subblock = 16 : i64, transpose = true} : (tensor<4x4xf32>, tensor<4x8xf32>, tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
      %s = "kda.add"(%a, %b) : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
      "kda.store"(%om, %c, %s) {name = "o"} : (memref<?x?x?x8xf32>, index, tensor<4x8xf32>) -> ()
      gpu.yield
    }) {reverse = false} : () -> ()
    return
  }
}

// -----

// A decay product whose gates differ per column (KDA's) keeps its fused form.
// CHECK-LABEL: func.func @key_gates
// CHECK:         "kda.decay_matmul"(%w, %x, %G, %G)
// CHECK-NOT:     "kda.dot"
// IDENTITY: per-key gates are not one value per row
module {
  func.func @key_gates(%wm: memref<?x?x?x4xf32> {kda.layout = "token", kda.name = "w", kda.role = "input"}, %xm: memref<?x?x?x8xf32> {kda.layout = "token", kda.name = "x", kda.role = "input"}, %gm: memref<?x?x?x8xf32> {kda.layout = "token", kda.name = "g", kda.role = "input"}, %om: memref<?x?x?x8xf32> {kda.layout = "token", kda.name = "o", kda.role = "output"}) attributes {kda.chunk_size = 4 : i64, kda.program = "key_gates"} {
    "kda.scan"() ({
    ^bb0(%c: index):
      %w = "kda.load"(%wm, %c) {head_map = "direct", name = "w"} : (memref<?x?x?x4xf32>, index) -> tensor<4x4xf32>
      %x = "kda.load"(%xm, %c) {head_map = "direct", name = "x"} : (memref<?x?x?x8xf32>, index) -> tensor<4x8xf32>
      %G = "kda.load"(%gm, %c) {head_map = "direct", name = "g"} : (memref<?x?x?x8xf32>, index) -> tensor<4x8xf32>
      %a = "kda.decay_matmul"(%w, %x, %G, %G) {clamp_min = -1.260000e+02 : f64, diagonal = -1 : i64, exact_diagonal = true, exp_bound = 1.260000e+02 : f64, exp_proof = "gamma_i - gamma_j <= 0", kda.precision = "tf32x3", subblock = 16 : i64, transpose = false} : (tensor<4x4xf32>, tensor<4x8xf32>, tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
      "kda.store"(%om, %c, %a) {name = "o"} : (memref<?x?x?x8xf32>, index, tensor<4x8xf32>) -> ()
      gpu.yield
    }) {reverse = false} : () -> ()
    return
  }
}
