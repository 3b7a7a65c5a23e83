// RUN: kdagen opt %s -p 'kda-stable-reassociate' | filecheck %s
// RUN: kdagen opt %s -p 'kda-stable-reassociate{max_exponent=2}' | filecheck %s --check-prefix=MAX2
// RUN: kdagen opt %s -p 'kda-stable-reassociate{subblock=1}' | filecheck %s --check-prefix=SUB1
// RUN: not kdagen opt %s -p 'kda-stable-reassociate' 2>&1 | filecheck %s --check-prefix=ERR

// An exp2 whose argument is declared in [-4, 0] gets its proven bound and the proof.
// With max_exponent=2 the argument may fall below -2: it is clamped there (clamp_min).
// CHECK-LABEL: func.func @bounded
// CHECK:         %[[G:.*]] = "kda.assume_range"
// CHECK-NEXT:    "kda.exp2"(%[[G]]) {exp_bound = 4.000000e+00 : f64, exp_proof = "argument in [-4, 0]"}
// MAX2-LABEL:  func.func @bounded
// MAX2:          "kda.exp2"(%{{.*}}) {clamp_min = -2.000000e+00 : f64, exp_bound = 2.000000e+00 : f64, exp_proof = "argument in [-4, 0]; clamped below at -2 (changes the value by < 2^-2)"}
module {
  func.func @bounded(%x: memref<?x4xf32> {kda.layout = "head", kda.name = "x", kda.role = "input"}, %y: memref<?x?x4xf32> {kda.layout = "state", kda.name = "y", kda.role = "output"}) {
    %x_h = "kda.load_head"(%x) {name = "x"} : (memref<?x4xf32>) -> tensor<4xf32>
    %g = "kda.assume_range"(%x_h) {hi = 0.000000e+00 : f64, lo = -4.000000e+00 : f64} : (tensor<4xf32>) -> tensor<4xf32>
    %e = "kda.exp2"(%g) : (tensor<4xf32>) -> tensor<4xf32>
    "kda.store_state"(%y, %e) {name = "y"} : (memref<?x?x4xf32>, tensor<4xf32>) -> ()
    return
  }
}

// -----

// A non-positive argument that may underflow fp32 (below -126) is clamped at -126.
// CHECK-LABEL: func.func @underflow
// CHECK:         "kda.exp2"(%{{.*}}) {clamp_min = -1.260000e+02 : f64, exp_bound = 1.260000e+02 : f64, exp_proof = "argument in [-200, 0]; clamped below at -126 (changes the value by < 2^-126)"}
module {
  func.func @underflow(%x: memref<?x4xf32> {kda.layout = "head", kda.name = "x", kda.role = "input"}, %y: memref<?x?x4xf32> {kda.layout = "state", kda.name = "y", kda.role = "output"}) {
    %x_h = "kda.load_head"(%x) {name = "x"} : (memref<?x4xf32>) -> tensor<4xf32>
    %g = "kda.assume_range"(%x_h) {hi = 0.000000e+00 : f64, lo = -2.000000e+02 : f64} : (tensor<4xf32>) -> tensor<4xf32>
    %e = "kda.exp2"(%g) : (tensor<4xf32>) -> tensor<4xf32>
    "kda.store_state"(%y, %e) {name = "y"} : (memref<?x?x4xf32>, tensor<4xf32>) -> ()
    return
  }
}

// -----

// An exp2 of an unbounded value (a load with no declared range) stops the pass.
// ERR: Error: pass 'kda-stable-reassociate' failed: kda.exp2 at loc("e"): argument bound [-inf, inf] exceeds {{.*}}126 and no bounded form applies (used by kda.store_state); declare a tighter gate range (a decaying gate, range (lo, 0] with any lo, always compiles; a gate that may grow needs |g| <= {{.*}} per token at chunk size 64) or write the product in relative form
module {
  func.func @unbounded(%x: memref<?x4xf32> {kda.layout = "head", kda.name = "x", kda.role = "input"}, %y: memref<?x?x4xf32> {kda.layout = "state", kda.name = "y", kda.role = "output"}) {
    %x_h = "kda.load_head"(%x) {name = "x"} : (memref<?x4xf32>) -> tensor<4xf32>
    %e = "kda.exp2"(%x_h) : (tensor<4xf32>) -> tensor<4xf32>
    "kda.store_state"(%y, %e) {name = "y"} : (memref<?x?x4xf32>, tensor<4xf32>) -> ()
    return
  }
}

// -----

// The naive factored decay product tril(dot(a * 2^G, (a * 2^-G)^T), -1), G a row cumsum of
// gates in [-1, 0], becomes the relative form decay_dot(a, a, G, G); the 2^G and 2^-G
// factors and the products go. Sub-blocks of 2 rows keep |exponent| <= 1 (subblock=1 forces
// the elementwise form).
// CHECK-LABEL: func.func @decay_product
// CHECK:         %[[A:.*]] = "kda.load"(%a
// CHECK:         %[[G:.*]] = "kda.cumsum"
// CHECK-NOT:     "kda.exp2"
// CHECK-NOT:     "kda.neg"
// CHECK-NOT:     "kda.dot"
// CHECK:         %[[L:.*]] = "kda.decay_dot"(%[[A]], %[[A]], %[[G]], %[[G]]) {diagonal = -1 : i64, exact_diagonal = false, exp_bound = 1.000000e+00 : f64, exp_proof = "gamma is a row cumsum of increments in [-1, 0], so gamma_i - gamma_j in [-1, 0] for j <= i; blocks of 2 rows factor as 2^(gamma_i - r) * 2^(r - gamma_j), r = gamma at the block's first row, |exponent| <= 1 in a block", subblock = 2 : i64} : (tensor<2x4xf32>, tensor<2x4xf32>, tensor<2x4xf32>, tensor<2x4xf32>) -> tensor<2x2xf32>
// CHECK-NEXT:    "kda.store"(%o, %{{.*}}, %[[L]])
// CHECK-NOT:     "kda.exp2"
// SUB1-LABEL:  func.func @decay_product
// SUB1:          "kda.decay_dot"({{.*}}) {diagonal = -1 : i64, exact_diagonal = false, exp_bound = 1.000000e+00 : f64, exp_proof = "gamma is a row cumsum of increments in [-1, 0], so gamma_i - gamma_j in [-1, 0] for j <= i", subblock = 1 : i64}
module {
  func.func @decay_product(%a: memref<?x?x?x4xf32> {kda.layout = "token", kda.name = "a", kda.role = "input"}, %g: memref<?x?x?x4xf32> {kda.layout = "token", kda.name = "g", kda.role = "input"}, %o: memref<?x?x?x2xf32> {kda.layout = "token", kda.name = "o", kda.role = "output"}) {
    "kda.scan"() ({
    ^bb0(%c: index):
      %a_c = "kda.load"(%a, %c) {head_map = "direct", name = "a"} : (memref<?x?x?x4xf32>, index) -> tensor<2x4xf32>
      %g_c = "kda.load"(%g, %c) {head_map = "direct", name = "g"} : (memref<?x?x?x4xf32>, index) -> tensor<2x4xf32>
      %gate = "kda.assume_range"(%g_c) {hi = 0.000000e+00 : f64, lo = -1.000000e+00 : f64} : (tensor<2x4xf32>) -> tensor<2x4xf32>
      %G = "kda.cumsum"(%gate) {reverse = false} : (tensor<2x4xf32>) -> tensor<2x4xf32>
      %eG = "kda.exp2"(%G) : (tensor<2x4xf32>) -> tensor<2x4xf32>
      %ad = "kda.mul"(%a_c, %eG) : (tensor<2x4xf32>, tensor<2x4xf32>) -> tensor<2x4xf32>
      %nG = "kda.neg"(%G) : (tensor<2x4xf32>) -> tensor<2x4xf32>
      %enG = "kda.exp2"(%nG) : (tensor<2x4xf32>) -> tensor<2x4xf32>
      %ai = "kda.mul"(%a_c, %enG) : (tensor<2x4xf32>, tensor<2x4xf32>) -> tensor<2x4xf32>
      %P = "kda.dot"(%ad, %ai) {transpose_lhs = false, transpose_rhs = true} : (tensor<2x4xf32>, tensor<2x4xf32>) -> tensor<2x2xf32>
      %L = "kda.tril"(%P) {diagonal = -1 : i64} : (tensor<2x2xf32>) -> tensor<2x2xf32>
      "kda.store"(%o, %c, %L) {name = "o"} : (memref<?x?x?x2xf32>, index, tensor<2x2xf32>) -> ()
      gpu.yield
    }) {reverse = false} : () -> ()
    return
  }
}

// -----

// 1 - sigmoid(x), which cancels when sigmoid(x) ~ 1, becomes sigmoid(-x).
// CHECK-LABEL: func.func @complement
// CHECK:         %[[X:.*]] = "kda.load_head"
// CHECK-NEXT:    %[[N:.*]] = "kda.neg"(%[[X]])
// CHECK-NEXT:    %[[S:.*]] = "kda.sigmoid"(%[[N]])
// CHECK-NEXT:    "kda.store_state"(%y, %[[S]])
// CHECK-NOT:     "kda.sub"
module {
  func.func @complement(%x: memref<?x4xf32> {kda.layout = "head", kda.name = "x", kda.role = "input"}, %y: memref<?x?x4xf32> {kda.layout = "state", kda.name = "y", kda.role = "output"}) {
    %x_h = "kda.load_head"(%x) {name = "x"} : (memref<?x4xf32>) -> tensor<4xf32>
    %s = "kda.sigmoid"(%x_h) : (tensor<4xf32>) -> tensor<4xf32>
    %one = "kda.constant"() {value = 1.000000e+00 : f64} : () -> tensor<4xf32>
    %d = "kda.sub"(%one, %s) : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
    "kda.store_state"(%y, %d) {name = "y"} : (memref<?x?x4xf32>, tensor<4xf32>) -> ()
    return
  }
}

// -----

// A backward module (a kda.primal forward beside it): the pass rewrites the primal and
// derives the backward again from it (the body of @f_bwd here is a placeholder), so the
// backward's products are the bounded adjoints of decay_dot (kda.decay_matmul).
// CHECK-LABEL: func.func @f_bwd(%a: {{.*}}, %g: {{.*}}, %do: {{.*}}, %da: {{.*}}, %dg: {{.*}}) attributes {kda.chunk_size = 2 : i64, kda.derived_from = "f", kda.program = "f_bwd"}
// CHECK:         "kda.scan"() ({
// CHECK-NOT:     "kda.exp2"
// CHECK:         "kda.decay_matmul"({{.*}}) {diagonal = -1 : i64, exact_diagonal = false, exp_bound = 1.000000e+00 : f64, {{.*}}transpose = false}
// CHECK:         "kda.decay_matmul"({{.*}}) {diagonal = -1 : i64, exact_diagonal = false, exp_bound = 1.000000e+00 : f64, {{.*}}transpose = true}
// CHECK-NOT:     "kda.exp2"
// CHECK:         }) {reverse = true} : () -> ()
// CHECK-LABEL: func.func @f_primal
// CHECK-NOT:     "kda.exp2"
// CHECK:         "kda.decay_dot"
module {
  func.func @f_bwd() {
    return
  }
  func.func @f_primal(%a: memref<?x?x?x4xf32> {kda.layout = "token", kda.name = "a", kda.role = "input"}, %g: memref<?x?x?x4xf32> {kda.layout = "token", kda.name = "g", kda.role = "input"}, %o: memref<?x?x?x2xf32> {kda.layout = "token", kda.name = "o", kda.role = "output"}) attributes {kda.chunk_size = 2 : i64, kda.primal, kda.program = "f"} {
    "kda.scan"() ({
    ^bb0(%c: index):
      %a_c = "kda.load"(%a, %c) {head_map = "direct", name = "a"} : (memref<?x?x?x4xf32>, index) -> tensor<2x4xf32>
      %g_c = "kda.load"(%g, %c) {head_map = "direct", name = "g"} : (memref<?x?x?x4xf32>, index) -> tensor<2x4xf32>
      %gate = "kda.assume_range"(%g_c) {hi = 0.000000e+00 : f64, lo = -1.000000e+00 : f64} : (tensor<2x4xf32>) -> tensor<2x4xf32>
      %G = "kda.cumsum"(%gate) {reverse = false} : (tensor<2x4xf32>) -> tensor<2x4xf32>
      %eG = "kda.exp2"(%G) : (tensor<2x4xf32>) -> tensor<2x4xf32>
      %ad = "kda.mul"(%a_c, %eG) : (tensor<2x4xf32>, tensor<2x4xf32>) -> tensor<2x4xf32>
      %nG = "kda.neg"(%G) : (tensor<2x4xf32>) -> tensor<2x4xf32>
      %enG = "kda.exp2"(%nG) : (tensor<2x4xf32>) -> tensor<2x4xf32>
      %ai = "kda.mul"(%a_c, %enG) : (tensor<2x4xf32>, tensor<2x4xf32>) -> tensor<2x4xf32>
      %P = "kda.dot"(%ad, %ai) {transpose_lhs = false, transpose_rhs = true} : (tensor<2x4xf32>, tensor<2x4xf32>) -> tensor<2x2xf32>
      %L = "kda.tril"(%P) {diagonal = -1 : i64} : (tensor<2x2xf32>) -> tensor<2x2xf32>
      "kda.store"(%o, %c, %L) {name = "o"} : (memref<?x?x?x2xf32>, index, tensor<2x2xf32>) -> ()
      gpu.yield
    }) {reverse = false} : () -> ()
    return
  }
}
