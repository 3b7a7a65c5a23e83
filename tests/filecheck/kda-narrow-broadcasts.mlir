// RUN: kdagen opt %s -p 'kda-narrow-broadcasts' | filecheck %s

// A per-token gate g [2] broadcast over 4 channels: its scaling by a splat constant, its
// cumsum, its exponential and the difference to its last row run on [2] (the last row of a
// [2] cumsum is a scalar, broadcast back); a broadcast of a broadcast becomes one; the decay
// product reads the broadcast cumsum; the op mixing the broadcast with a full tile (k * eG)
// stays [2, 4].
// CHECK-LABEL: func.func @gate
// CHECK:         ^bb0(%[[C:.*]]: index):
// CHECK:         %[[G:.*]] = "kda.load"(%g, %[[C]]) {{.*}} -> tensor<2xf32>
// CHECK:         %[[L:.*]] = "kda.constant"() {value = 1.442{{.*}} : f64} : () -> tensor<2xf32>
// CHECK-NEXT:    %[[GL:.*]] = "kda.mul"(%[[G]], %[[L]]) : (tensor<2xf32>, tensor<2xf32>) -> tensor<2xf32>
// CHECK-NEXT:    %[[CS:.*]] = "kda.cumsum"(%[[GL]]) {reverse = false} : (tensor<2xf32>) -> tensor<2xf32>
// CHECK-NEXT:    %[[CSB:.*]] = "kda.broadcast"(%[[CS]]) {dims = array<i64: 1>} : (tensor<2xf32>) -> tensor<2x4xf32>
// CHECK-NEXT:    %[[LAST:.*]] = "kda.extract_row"(%[[CS]]) {index = -1 : i64} : (tensor<2xf32>) -> tensor<f32>
// CHECK:         %[[E:.*]] = "kda.exp2"(%[[CS]]) {clamp_min = -1.260000e+02 : f64} : (tensor<2xf32>) -> tensor<2xf32>
// CHECK-NEXT:    %[[EB:.*]] = "kda.broadcast"(%[[E]]) {dims = array<i64: 1>} : (tensor<2xf32>) -> tensor<2x4xf32>
// CHECK-NEXT:    %[[KD:.*]] = "kda.mul"(%[[K:.*]], %[[EB]]) : (tensor<2x4xf32>, tensor<2x4xf32>) -> tensor<2x4xf32>
// CHECK:         %[[LB:.*]] = "kda.broadcast"(%[[LAST]]) {dims = array<i64: 0>} : (tensor<f32>) -> tensor<2xf32>
// CHECK-NEXT:    %[[D:.*]] = "kda.sub"(%[[LB]], %[[CS]]) : (tensor<2xf32>, tensor<2xf32>) -> tensor<2xf32>
// CHECK-NEXT:    "kda.broadcast"(%[[D]]) {dims = array<i64: 1>} : (tensor<2xf32>) -> tensor<2x4xf32>
// CHECK:         "kda.broadcast"(%[[LAST]]) {dims = array<i64: 0, 1>} : (tensor<f32>) -> tensor<4x4xf32>
// CHECK:         "kda.decay_dot"(%[[K]], %[[K]], %[[CSB]], %[[CSB]])
// CHECK-NOT:     "kda.cumsum"({{.*}}) : (tensor<2x4xf32>)
// CHECK-NOT:     "kda.exp2"({{.*}}) : (tensor<2x4xf32>)
module {
  func.func @gate(%g: memref<?x?x?xf32> {kda.layout = "token", kda.name = "g", kda.role = "input"}, %k: memref<?x?x?x4xf32> {kda.layout = "token", kda.name = "k", kda.role = "input"}, %kd_out: memref<?x?x?x4xf32> {kda.layout = "token", kda.name = "kd", kda.role = "output"}, %r_out: memref<?x?x?x4xf32> {kda.layout = "token", kda.name = "r", kda.role = "output"}, %s_out: memref<?x?x4x4xf32> {kda.layout = "chunk", kda.name = "s", kda.role = "output"}, %a_out: memref<?x?x2x2xf32> {kda.layout = "chunk", kda.name = "a", kda.role = "output"}) attributes {kda.chunk_size = 2 : i64, kda.program = "gate"} {
    "kda.scan"() ({
    ^bb0(%c: index):
      %g_c = "kda.load"(%g, %c) {head_map = "direct", name = "g"} : (memref<?x?x?xf32>, index) -> tensor<2xf32>
      %k_c = "kda.load"(%k, %c) {head_map = "direct", name = "k"} : (memref<?x?x?x4xf32>, index) -> tensor<2x4xf32>
      %g_k = "kda.broadcast"(%g_c) {dims = array<i64: 1>} : (tensor<2xf32>) -> tensor<2x4xf32>
      %l2e = "kda.constant"() {value = 1.4426950408889634 : f64} : () -> tensor<2x4xf32>
      %gl = "kda.mul"(%g_k, %l2e) : (tensor<2x4xf32>, tensor<2x4xf32>) -> tensor<2x4xf32>
      %G = "kda.cumsum"(%gl) {reverse = false} : (tensor<2x4xf32>) -> tensor<2x4xf32>
      %G_C = "kda.extract_row"(%G) {index = -1 : i64} : (tensor<2x4xf32>) -> tensor<4xf32>
      %eG = "kda.exp2"(%G) {clamp_min = -1.260000e+02 : f64} : (tensor<2x4xf32>) -> tensor<2x4xf32>
      %kd = "kda.mul"(%k_c, %eG) : (tensor<2x4xf32>, tensor<2x4xf32>) -> tensor<2x4xf32>
      "kda.store"(%kd_out, %c, %kd) {name = "kd"} : (memref<?x?x?x4xf32>, index, tensor<2x4xf32>) -> ()
      %G_Cb = "kda.broadcast"(%G_C) {dims = array<i64: 0>} : (tensor<4xf32>) -> tensor<2x4xf32>
      %r = "kda.sub"(%G_Cb, %G) : (tensor<2x4xf32>, tensor<2x4xf32>) -> tensor<2x4xf32>
      "kda.store"(%r_out, %c, %r) {name = "r"} : (memref<?x?x?x4xf32>, index, tensor<2x4xf32>) -> ()
      %s = "kda.broadcast"(%G_C) {dims = array<i64: 1>} : (tensor<4xf32>) -> tensor<4x4xf32>
      "kda.store_chunk"(%s_out, %c, %s) {name = "s"} : (memref<?x?x4x4xf32>, index, tensor<4x4xf32>) -> ()
      %a = "kda.decay_dot"(%k_c, %k_c, %G, %G) {diagonal = 0 : i64, exact_diagonal = false, subblock = 1 : i64} : (tensor<2x4xf32>, tensor<2x4xf32>, tensor<2x4xf32>, tensor<2x4xf32>) -> tensor<2x2xf32>
      "kda.store_chunk"(%a_out, %c, %a) {name = "a"} : (memref<?x?x2x2xf32>, index, tensor<2x2xf32>) -> ()
      gpu.yield
    }) {reverse = false} : () -> ()
    return
  }
}
