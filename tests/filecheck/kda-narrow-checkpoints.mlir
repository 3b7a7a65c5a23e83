// RUN: kdagen opt %s -p 'kda-narrow-checkpoints{dtype=fp16,scale=none}' | filecheck %s
// RUN: kdagen opt %s -p 'kda-narrow-checkpoints{dtype=fp16}' | filecheck %s --check-prefix=SCALED

// A serial kernel checkpoints its carried state per chunk; a chunk-parallel kernel reads it only
// as a TF32 product's operand. The workspace becomes f16: the store converts, the load widens.
// CHECK-LABEL: func.func @tf32_reader
// CHECK:         %[[WS:.*]] = "kda.workspace"() {layout = "chunk", name = "S_chunks"} : () -> memref<?x?x4x8xf16>
// CHECK:         %[[N:.*]] = "kda.convert"(%{{.*}}) : (tensor<4x8xf32>) -> tensor<4x8xf16>
// CHECK-NEXT:    "kda.store_chunk"(%[[WS]], %{{.*}}, %[[N]]) {name = "S"} : (memref<?x?x4x8xf16>, index, tensor<4x8xf16>) -> ()
// CHECK:         %[[L:.*]] = "kda.load_chunk"(%[[WS]], %{{.*}}) {name = "S"} : (memref<?x?x4x8xf16>, index) -> tensor<4x8xf16>
// CHECK-NEXT:    %[[W:.*]] = "kda.convert"(%[[L]]) : (tensor<4x8xf16>) -> tensor<4x8xf32>
// CHECK-NEXT:    "kda.dot"(%q, %[[W]]) {kda.precision = "tf32"
// Scaled (the default): each column divided by its 2-norm over the rows before the conversion,
// the norms stored beside it in fp32, multiplied back after the load.
// SCALED-LABEL: func.func @tf32_reader
// SCALED-DAG:     %[[NW:.*]] = "kda.workspace"() {layout = "chunk", name = "S_chunks_norm"} : () -> memref<?x?x8xf32>
// SCALED-DAG:     %[[WS:.*]] = "kda.workspace"() {layout = "chunk", name = "S_chunks"} : () -> memref<?x?x4x8xf16>
// SCALED:         %[[SQ:.*]] = "kda.mul"(%[[S:.*]], %[[S]]) : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
// SCALED-NEXT:    %[[SUM:.*]] = "kda.reduce_sum"(%[[SQ]]) {dims = array<i64: 0>} : (tensor<4x8xf32>) -> tensor<8xf32>
// SCALED:         %[[INV:.*]] = "kda.rsqrt"
// SCALED-NEXT:    %[[NORM:.*]] = "kda.mul"
// SCALED-NEXT:    %[[B:.*]] = "kda.broadcast"(%[[INV]]) {dims = array<i64: 0>} : (tensor<8xf32>) -> tensor<4x8xf32>
// SCALED-NEXT:    %[[X:.*]] = "kda.mul"(%[[S]], %[[B]])
// SCALED-NEXT:    "kda.store_chunk"(%[[NW]], %{{.*}}, %[[NORM]]) {name = "S_norm"}
// SCALED-NEXT:    %[[N:.*]] = "kda.convert"(%[[X]]) : (tensor<4x8xf32>) -> tensor<4x8xf16>
// SCALED-NEXT:    "kda.store_chunk"(%[[WS]], %{{.*}}, %[[N]]) {name = "S"}
// SCALED:         %[[L:.*]] = "kda.load_chunk"(%[[WS]], %{{.*}}) {name = "S"}
// SCALED-NEXT:    %[[W:.*]] = "kda.convert"(%[[L]]) : (tensor<4x8xf16>) -> tensor<4x8xf32>
// SCALED-NEXT:    %[[LN:.*]] = "kda.load_chunk"(%[[NW]], %{{.*}}) {name = "S_norm"} : (memref<?x?x8xf32>, index) -> tensor<8xf32>
// SCALED-NEXT:    %[[BN:.*]] = "kda.broadcast"(%[[LN]]) {dims = array<i64: 0>}
// SCALED-NEXT:    %[[Y:.*]] = "kda.mul"(%[[W]], %[[BN]])
// SCALED-NEXT:    "kda.dot"(%q, %[[Y]]) {kda.precision = "tf32"
module {
  func.func @tf32_reader(%qm: memref<?x?x?x4xf32> {kda.layout = "token", kda.name = "q", kda.role = "input"}, %km: memref<?x?x?x8xf32> {kda.layout = "token", kda.name = "k", kda.role = "input"}, %om: memref<?x?x?x8xf32> {kda.layout = "token", kda.name = "o", kda.role = "output"}) attributes {kda.chunk_size = 4 : i64, kda.program = "tf32_reader"} {
    %S_chunks = "kda.workspace"() {layout = "chunk", name = "S_chunks"} : () -> memref<?x?x4x8xf32>
    %h0 = "kda.constant"() {value = 0.0 : f64} : () -> tensor<4x8xf32>
    %S_final = "kda.scan"(%h0) ({
    ^bb0(%c: index, %S: tensor<4x8xf32>):
      %k = "kda.load"(%km, %c) {head_map = "direct", name = "k"} : (memref<?x?x?x8xf32>, index) -> tensor<4x8xf32>
      %next = "kda.add"(%S, %k) : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
      "kda.store_chunk"(%S_chunks, %c, %S) {name = "S"} : (memref<?x?x4x8xf32>, index, tensor<4x8xf32>) -> ()
      gpu.yield %next : tensor<4x8xf32>
    }) {kda.kernel = "p_state", parallel = false, reverse = false} : (tensor<4x8xf32>) -> tensor<4x8xf32>
    "kda.scan"() ({
    ^bb0(%c: index):
      %q = "kda.load"(%qm, %c) {head_map = "direct", name = "q"} : (memref<?x?x?x4xf32>, index) -> tensor<4x4xf32>
      %S = "kda.load_chunk"(%S_chunks, %c) {name = "S"} : (memref<?x?x4x8xf32>, index) -> tensor<4x8xf32>
      %o = "kda.dot"(%q, %S) {kda.precision = "tf32", transpose_lhs = false, transpose_rhs = false} : (tensor<4x4xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
      "kda.store"(%om, %c, %o) {name = "o"} : (memref<?x?x?x8xf32>, index, tensor<4x8xf32>) -> ()
      gpu.yield
    }) {kda.kernel = "p_out", parallel = true, reverse = false} : () -> ()
    return
  }
}

// -----

// The same checkpoint read at bf16x3 (about 16 significand bits, more than fp16 keeps): it
// stays fp32.
// CHECK-LABEL: func.func @bf16x3_reader
// CHECK:         "kda.workspace"() {layout = "chunk", name = "S_chunks"} : () -> memref<?x?x4x8xf32>
// CHECK-NOT:     xf16
// IDENTITY: its only reader rounds to more bits than fp16 holds
module {
  func.func @bf16x3_reader(%qm: memref<?x?x?x4xf32> {kda.layout = "token", kda.name = "q", kda.role = "input"}, %km: memref<?x?x?x8xf32> {kda.layout = "token", kda.name = "k", kda.role = "input"}, %om: memref<?x?x?x8xf32> {kda.layout = "token", kda.name = "o", kda.role = "output"}) attributes {kda.chunk_size = 4 : i64, kda.program = "bf16x3_reader"} {
    %S_chunks = "kda.workspace"() {layout = "chunk", name = "S_chunks"} : () -> memref<?x?x4x8xf32>
    %h0 = "kda.constant"() {value = 0.0 : f64} : () -> tensor<4x8xf32>
    %S_final = "kda.scan"(%h0) ({
    ^bb0(%c: index, %S: tensor<4x8xf32>):
      %k = "kda.load"(%km, %c) {head_map = "direct", name = "k"} : (memref<?x?x?x8xf32>, index) -> tensor<4x8xf32>
      %next = "kda.add"(%S, %k) : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
      "kda.store_chunk"(%S_chunks, %c, %S) {name = "S"} : (memref<?x?x4x8xf32>, index, tensor<4x8xf32>) -> ()
      gpu.yield %next : tensor<4x8xf32>
    }) {kda.kernel = "p_state", parallel = false, reverse = false} : (tensor<4x8xf32>) -> tensor<4x8xf32>
    "kda.scan"() ({
    ^bb0(%c: index):
      %q = "kda.load"(%qm, %c) {head_map = "direct", name = "q"} : (memref<?x?x?x4xf32>, index) -> tensor<4x4xf32>
      %S = "kda.load_chunk"(%S_chunks, %c) {name = "S"} : (memref<?x?x4x8xf32>, index) -> tensor<4x8xf32>
      %o = "kda.dot"(%q, %S) {kda.precision = "bf16x3", transpose_lhs = false, transpose_rhs = false} : (tensor<4x4xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
      "kda.store"(%om, %c, %o) {name = "o"} : (memref<?x?x?x8xf32>, index, tensor<4x8xf32>) -> ()
      gpu.yield
    }) {kda.kernel = "p_out", parallel = true, reverse = false} : () -> ()
    return
  }
}
