// RUN: kdagen opt %s -p 'kda-narrow-reductions' | filecheck %s

// The row sum of a gate adjoint built from row cumsums of [2, 4] tiles (the shape of GDN's
// derived dg): -x + cumsum(x) + revcumsum(y), scaled by a splat constant, then summed over
// the 4 channels. The sum moves below both cumsums: x and y are each reduced once (x's
// negation reuses its row sum), the cumsums, the add and the scaling run on [2], and no
// [2, 4] cumsum is left.
// CHECK-LABEL: func.func @gate_adjoint
// CHECK:         %[[RX:.*]] = "kda.reduce_sum"(%x) {dims = array<i64: 1>} : (tensor<2x4xf32>) -> tensor<2xf32>
// CHECK-NEXT:    %[[NX:.*]] = "kda.neg"(%[[RX]]) : (tensor<2xf32>) -> tensor<2xf32>
// CHECK-NEXT:    %[[CX:.*]] = "kda.cumsum"(%[[RX]]) {reverse = false} : (tensor<2xf32>) -> tensor<2xf32>
// CHECK-NEXT:    %[[A:.*]] = "kda.add"(%[[NX]], %[[CX]]) : (tensor<2xf32>, tensor<2xf32>) -> tensor<2xf32>
// CHECK-NEXT:    %[[RY:.*]] = "kda.reduce_sum"(%y) {dims = array<i64: 1>} : (tensor<2x4xf32>) -> tensor<2xf32>
// CHECK-NEXT:    %[[CY:.*]] = "kda.cumsum"(%[[RY]]) {reverse = true} : (tensor<2xf32>) -> tensor<2xf32>
// CHECK-NEXT:    %[[S:.*]] = "kda.add"(%[[A]], %[[CY]]) : (tensor<2xf32>, tensor<2xf32>) -> tensor<2xf32>
// CHECK-NEXT:    %[[L:.*]] = "kda.constant"() {value = 1.442{{.*}} : f64} : () -> tensor<2xf32>
// CHECK-NEXT:    %[[D:.*]] = "kda.mul"(%[[S]], %[[L]]) : (tensor<2xf32>, tensor<2xf32>) -> tensor<2xf32>
// CHECK-NEXT:    "kda.store"(%dg_out, %c, %[[D]])
// CHECK-NOT:     "kda.cumsum"({{.*}}) : (tensor<2x4xf32>)
module {
  func.func @gate_adjoint(%a: memref<?x?x?x4xf32> {kda.layout = "token", kda.name = "a", kda.role = "input"}, %b: memref<?x?x?x4xf32> {kda.layout = "token", kda.name = "b", kda.role = "input"}, %dg_out: memref<?x?x?xf32> {kda.layout = "token", kda.name = "dg", kda.role = "output"}) attributes {kda.chunk_size = 2 : i64, kda.program = "gate_adjoint"} {
    "kda.scan"() ({
    ^bb0(%c: index):
      %x = "kda.load"(%a, %c) {head_map = "direct", name = "a"} : (memref<?x?x?x4xf32>, index) -> tensor<2x4xf32>
      %y = "kda.load"(%b, %c) {head_map = "direct", name = "b"} : (memref<?x?x?x4xf32>, index) -> tensor<2x4xf32>
      %nx = "kda.neg"(%x) : (tensor<2x4xf32>) -> tensor<2x4xf32>
      %cx = "kda.cumsum"(%x) {reverse = false} : (tensor<2x4xf32>) -> tensor<2x4xf32>
      %ex = "kda.add"(%nx, %cx) : (tensor<2x4xf32>, tensor<2x4xf32>) -> tensor<2x4xf32>
      %cy = "kda.cumsum"(%y) {reverse = true} : (tensor<2x4xf32>) -> tensor<2x4xf32>
      %s = "kda.add"(%ex, %cy) : (tensor<2x4xf32>, tensor<2x4xf32>) -> tensor<2x4xf32>
      %l2e = "kda.constant"() {value = 1.4426950408889634 : f64} : () -> tensor<2x4xf32>
      %d = "kda.mul"(%s, %l2e) : (tensor<2x4xf32>, tensor<2x4xf32>) -> tensor<2x4xf32>
      %dg = "kda.reduce_sum"(%d) {dims = array<i64: 1>} : (tensor<2x4xf32>) -> tensor<2xf32>
      "kda.store"(%dg_out, %c, %dg) {name = "dg"} : (memref<?x?x?xf32>, index, tensor<2xf32>) -> ()
      gpu.yield
    }) {reverse = false} : () -> ()
    return
  }
}

// -----

// A cumsum whose [2, 4] result is also stored (KDA's per-channel dg) keeps its shape: the row
// sum stays after it, nothing is rewritten.
// CHECK-LABEL: func.func @shared
// CHECK:         %[[C:.*]] = "kda.cumsum"(%x) {reverse = true} : (tensor<2x4xf32>) -> tensor<2x4xf32>
// CHECK:         "kda.reduce_sum"(%[[C]]) {dims = array<i64: 1>} : (tensor<2x4xf32>) -> tensor<2xf32>
// IDENTITY: a cumsum read twice is not rewritten
module {
  func.func @shared(%a: memref<?x?x?x4xf32> {kda.layout = "token", kda.name = "a", kda.role = "input"}, %g_out: memref<?x?x?x4xf32> {kda.layout = "token", kda.name = "g", kda.role = "output"}, %dg_out: memref<?x?x?xf32> {kda.layout = "token", kda.name = "dg", kda.role = "output"}) attributes {kda.chunk_size = 2 : i64, kda.program = "shared"} {
    "kda.scan"() ({
    ^bb0(%c: index):
      %x = "kda.load"(%a, %c) {head_map = "direct", name = "a"} : (memref<?x?x?x4xf32>, index) -> tensor<2x4xf32>
      %cx = "kda.cumsum"(%x) {reverse = true} : (tensor<2x4xf32>) -> tensor<2x4xf32>
      "kda.store"(%g_out, %c, %cx) {name = "g"} : (memref<?x?x?x4xf32>, index, tensor<2x4xf32>) -> ()
      %dg = "kda.reduce_sum"(%cx) {dims = array<i64: 1>} : (tensor<2x4xf32>) -> tensor<2xf32>
      "kda.store"(%dg_out, %c, %dg) {name = "dg"} : (memref<?x?x?xf32>, index, tensor<2xf32>) -> ()
      gpu.yield
    }) {reverse = false} : () -> ()
    return
  }
}
