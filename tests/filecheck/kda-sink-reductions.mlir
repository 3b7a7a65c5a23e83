// RUN: kdagen opt %s -p 'kda-sink-reductions' | filecheck %s

// A per-token gradient summed over 4 channels after a reverse row cumsum and a scaling by a
// splat constant: the sum over the channels runs first, on [2, 4], and the cumsum and the
// scaling on its [2] result. The cumsum whose [2, 4] result is also stored keeps its shape
// (its sum over the channels would need the [2, 4] values anyway).
// CHECK-LABEL: func.func @grad
// CHECK:         %[[D:.*]] = "kda.load"(%d, %{{.*}}) {{.*}} -> tensor<2x4xf32>
// CHECK-NEXT:    %[[R:.*]] = "kda.reduce_sum"(%[[D]]) {dims = array<i64: 1>} : (tensor<2x4xf32>) -> tensor<2xf32>
// CHECK-NEXT:    %[[S:.*]] = "kda.cumsum"(%[[R]]) {reverse = true} : (tensor<2xf32>) -> tensor<2xf32>
// CHECK-NEXT:    %[[L:.*]] = "kda.constant"() {value = 1.442{{.*}} : f64} : () -> tensor<2xf32>
// CHECK-NEXT:    %[[M:.*]] = "kda.mul"(%[[S]], %[[L]]) : (tensor<2xf32>, tensor<2xf32>) -> tensor<2xf32>
// CHECK-NEXT:    "kda.store"(%dg_out, %{{.*}}, %[[M]])
// CHECK:         %[[KEPT:.*]] = "kda.cumsum"(%[[D]]) {reverse = false} : (tensor<2x4xf32>) -> tensor<2x4xf32>
// CHECK-NEXT:    "kda.store"(%dk_out, %{{.*}}, %[[KEPT]])
// CHECK-NEXT:    "kda.reduce_sum"(%[[KEPT]]) {dims = array<i64: 1>} : (tensor<2x4xf32>) -> tensor<2xf32>
module {
  func.func @grad(%d: memref<?x?x?x4xf32> {kda.layout = "token", kda.name = "d", kda.role = "input"}, %dg_out: memref<?x?x?xf32> {kda.layout = "token", kda.name = "dg", kda.role = "output"}, %dk_out: memref<?x?x?x4xf32> {kda.layout = "token", kda.name = "dk", kda.role = "output"}, %s_out: memref<?x?x?xf32> {kda.layout = "token", kda.name = "s", kda.role = "output"}) attributes {kda.chunk_size = 2 : i64, kda.program = "grad"} {
    "kda.scan"() ({
    ^bb0(%c: index):
      %d_c = "kda.load"(%d, %c) {head_map = "direct", name = "d"} : (memref<?x?x?x4xf32>, index) -> tensor<2x4xf32>
      %cs = "kda.cumsum"(%d_c) {reverse = true} : (tensor<2x4xf32>) -> tensor<2x4xf32>
      %l2e = "kda.constant"() {value = 1.4426950408889634 : f64} : () -> tensor<2x4xf32>
      %scaled = "kda.mul"(%cs, %l2e) : (tensor<2x4xf32>, tensor<2x4xf32>) -> tensor<2x4xf32>
      %dg = "kda.reduce_sum"(%scaled) {dims = array<i64: 1>} : (tensor<2x4xf32>) -> tensor<2xf32>
      "kda.store"(%dg_out, %c, %dg) {name = "dg"} : (memref<?x?x?xf32>, index, tensor<2xf32>) -> ()
      %kept = "kda.cumsum"(%d_c) {reverse = false} : (tensor<2x4xf32>) -> tensor<2x4xf32>
      "kda.store"(%dk_out, %c, %kept) {name = "dk"} : (memref<?x?x?x4xf32>, index, tensor<2x4xf32>) -> ()
      %s = "kda.reduce_sum"(%kept) {dims = array<i64: 1>} : (tensor<2x4xf32>) -> tensor<2xf32>
      "kda.store"(%s_out, %c, %s) {name = "s"} : (memref<?x?x?xf32>, index, tensor<2xf32>) -> ()
      gpu.yield
    }) {reverse = false} : () -> ()
    return
  }
}
