// RUN: kdagen opt %s -p 'kda-partition' | filecheck %s
// RUN: kdagen opt %s -p 'kda-partition{workspace_dtype=fp32}' | filecheck %s --check-prefix=FP32
// RUN: kdagen opt %s -p 'kda-partition{fuse=false}' | filecheck %s --check-prefix=NOFUSE
// RUN: not kdagen opt %s -p 'kda-partition' 2>&1 | filecheck %s --check-prefix=ERR

// A scan carrying a state S whose chunk work (A = k k^T, its triangular inverse, w = A^-1 k)
// does not depend on S: it moves to a chunk-parallel kernel (no carried values) that stores w
// into a per-chunk workspace; the state kernel loads w (load_chunk) and re-reads k rather
// than copying it. w is only a matrix operand, so `auto` stores it in bf16.
// CHECK-LABEL: func.func @p
// CHECK:         %[[S0:.*]] = "kda.load_state"(%h0)
// CHECK-NEXT:    %[[WS:.*]] = "kda.workspace"() {layout = "chunk", name = "w_ws"} : () -> memref<?x?x2x4xbf16>
// CHECK-NEXT:    "kda.scan"() ({
// CHECK-NEXT:    ^bb0(%[[C:.*]]: index):
// CHECK-NEXT:      %[[K:.*]] = "kda.load"(%k, %[[C]])
// CHECK-NEXT:      %[[A:.*]] = "kda.dot"(%[[K]], %[[K]])
// CHECK-NEXT:      %[[AI:.*]] = "kda.tril_inv"(%[[A]])
// CHECK-NEXT:      %[[W:.*]] = "kda.dot"(%[[AI]], %[[K]])
// CHECK-NEXT:      %[[WB:.*]] = "kda.convert"(%[[W]]) : (tensor<2x4xf32>) -> tensor<2x4xbf16>
// CHECK-NEXT:      "kda.store_chunk"(%[[WS]], %[[C]], %[[WB]]) {name = "w"}
// CHECK-NEXT:      gpu.yield
// CHECK-NEXT:    }) {kda.hbm_bytes_per_token = 2.400000e+01 : f64, kda.kernel = "p_chunk", parallel = true, reverse = false} : () -> ()
// CHECK-NEXT:    %[[SF:.*]] = "kda.scan"(%[[S0]]) ({
// CHECK-NEXT:    ^bb0(%[[C2:.*]]: index, %[[S:.*]]: tensor<4x4xf32>):
// CHECK-NEXT:      %[[WL:.*]] = "kda.load_chunk"(%[[WS]], %[[C2]]) {name = "w"} : (memref<?x?x2x4xbf16>, index) -> tensor<2x4xbf16>
// CHECK-NEXT:      %[[WF:.*]] = "kda.convert"(%[[WL]]) : (tensor<2x4xbf16>) -> tensor<2x4xf32>
// CHECK-NEXT:      %[[K2:.*]] = "kda.load"(%k, %[[C2]])
// CHECK-NOT:       "kda.tril_inv"
// CHECK-NEXT:      %[[T:.*]] = "kda.dot"(%[[WF]], %[[S]])
// CHECK-NEXT:      %[[DS:.*]] = "kda.dot"(%[[K2]], %[[T]])
// CHECK-NEXT:      %[[SN:.*]] = "kda.sub"(%[[S]], %[[DS]])
// CHECK-NEXT:      gpu.yield %[[SN]]
// CHECK-NEXT:    }) {kda.hbm_bytes_per_token = 2.400000e+01 : f64, kda.kernel = "p_state", parallel = false, reverse = false}
// CHECK-NEXT:    "kda.store_state"(%hT, %[[SF]])
// With workspace_dtype=fp32, w crosses in fp32 (no conversions).
// FP32-LABEL:  func.func @p
// FP32:          "kda.workspace"() {layout = "chunk", name = "w_ws"} : () -> memref<?x?x2x4xf32>
// FP32-NOT:      "kda.convert"
// FP32:          kda.kernel = "p_chunk"
// FP32:          "kda.load_chunk"({{.*}}) {name = "w"} : (memref<?x?x2x4xf32>, index) -> tensor<2x4xf32>
// FP32-NOT:      "kda.convert"
// FP32:          kda.kernel = "p_state"
// Without fusion every chunk value the state part uses crosses, the loaded k too.
// NOFUSE-LABEL: func.func @p
// NOFUSE:         "kda.workspace"() {layout = "chunk", name = "k_c_ws"}
// NOFUSE-NEXT:    "kda.workspace"() {layout = "chunk", name = "w_ws"}
// NOFUSE:         "kda.store_chunk"({{.*}}) {name = "k_c"}
// NOFUSE:         "kda.store_chunk"({{.*}}) {name = "w"}
// NOFUSE:         kda.kernel = "p_chunk"
// NOFUSE:         "kda.load_chunk"({{.*}}) {name = "k_c"}
// NOFUSE:         "kda.load_chunk"({{.*}}) {name = "w"}
// NOFUSE-NOT:     "kda.load"(
// NOFUSE:         kda.kernel = "p_state"
module {
  func.func @p(%k: memref<?x?x?x4xf32> {kda.layout = "token", kda.name = "k", kda.role = "input"}, %h0: memref<?x?x4x4xf32> {kda.layout = "state", kda.name = "h0", kda.role = "input"}, %hT: memref<?x?x4x4xf32> {kda.layout = "state", kda.name = "hT", kda.role = "output"}) attributes {kda.chunk_size = 2 : i64, kda.program = "p"} {
    %S0 = "kda.load_state"(%h0) {name = "h0"} : (memref<?x?x4x4xf32>) -> tensor<4x4xf32>
    %S_final = "kda.scan"(%S0) ({
    ^bb0(%c: index, %S: tensor<4x4xf32>):
      %k_c = "kda.load"(%k, %c) {head_map = "direct", name = "k"} : (memref<?x?x?x4xf32>, index) -> tensor<2x4xf32>
      %A = "kda.dot"(%k_c, %k_c) {transpose_lhs = false, transpose_rhs = true} : (tensor<2x4xf32>, tensor<2x4xf32>) -> tensor<2x2xf32>
      %Ainv = "kda.tril_inv"(%A) : (tensor<2x2xf32>) -> tensor<2x2xf32>
      %w = "kda.dot"(%Ainv, %k_c) {transpose_lhs = false, transpose_rhs = false} : (tensor<2x2xf32>, tensor<2x4xf32>) -> tensor<2x4xf32>
      %t = "kda.dot"(%w, %S) {transpose_lhs = false, transpose_rhs = false} : (tensor<2x4xf32>, tensor<4x4xf32>) -> tensor<2x4xf32>
      %dS = "kda.dot"(%k_c, %t) {transpose_lhs = true, transpose_rhs = false} : (tensor<2x4xf32>, tensor<2x4xf32>) -> tensor<4x4xf32>
      %S_next = "kda.sub"(%S, %dS) : (tensor<4x4xf32>, tensor<4x4xf32>) -> tensor<4x4xf32>
      gpu.yield %S_next : tensor<4x4xf32>
    }) {reverse = false} : (tensor<4x4xf32>) -> tensor<4x4xf32>
    "kda.store_state"(%hT, %S_final) {name = "hT"} : (memref<?x?x4x4xf32>, tensor<4x4xf32>) -> ()
    return
  }
}

// -----

// The only state-independent matrix work, the [4, 4] outer product k^T k, is larger than
// its operand: re-reading k (32 bytes) in the state kernel costs less than writing and
// reading the product (128 bytes), so the min cut keeps one kernel. Without fusion the
// product crosses (fp32: it is summed, not a matrix operand).
// CHECK-LABEL: func.func @r
// CHECK-NOT:     "kda.workspace"
// CHECK:         "kda.scan"(%{{.*}}) ({
// CHECK:           "kda.dot"
// CHECK:         }) {kda.hbm_bytes_per_token = 1.600000e+01 : f64, kda.kernel = "r_scan", parallel = false, reverse = false}
// CHECK-NOT:     "kda.scan"
// NOFUSE-LABEL: func.func @r
// NOFUSE:         "kda.workspace"() {layout = "chunk", name = "kk_ws"} : () -> memref<?x?x4x4xf32>
// NOFUSE:         kda.kernel = "r_chunk", parallel = true
// NOFUSE:         "kda.load_chunk"({{.*}}) {name = "kk"}
// NOFUSE-NOT:     "kda.dot"
// NOFUSE:         kda.kernel = "r_state", parallel = false
module {
  func.func @r(%k: memref<?x?x?x4xf32> {kda.layout = "token", kda.name = "k", kda.role = "input"}, %h0: memref<?x?x4x4xf32> {kda.layout = "state", kda.name = "h0", kda.role = "input"}, %hT: memref<?x?x4x4xf32> {kda.layout = "state", kda.name = "hT", kda.role = "output"}) attributes {kda.chunk_size = 2 : i64, kda.program = "r"} {
    %S0 = "kda.load_state"(%h0) {name = "h0"} : (memref<?x?x4x4xf32>) -> tensor<4x4xf32>
    %S_final = "kda.scan"(%S0) ({
    ^bb0(%c: index, %S: tensor<4x4xf32>):
      %k_c = "kda.load"(%k, %c) {head_map = "direct", name = "k"} : (memref<?x?x?x4xf32>, index) -> tensor<2x4xf32>
      %kk = "kda.dot"(%k_c, %k_c) {transpose_lhs = true, transpose_rhs = false} : (tensor<2x4xf32>, tensor<2x4xf32>) -> tensor<4x4xf32>
      %S_next = "kda.add"(%S, %kk) : (tensor<4x4xf32>, tensor<4x4xf32>) -> tensor<4x4xf32>
      gpu.yield %S_next : tensor<4x4xf32>
    }) {reverse = false} : (tensor<4x4xf32>) -> tensor<4x4xf32>
    "kda.store_state"(%hT, %S_final) {name = "hT"} : (memref<?x?x4x4xf32>, tensor<4x4xf32>) -> ()
    return
  }
}

// -----

// A scan with no carried values is already chunk-parallel: one kernel, marked parallel.
// CHECK-LABEL: func.func @q
// CHECK-NOT:     "kda.workspace"
// CHECK:         }) {kda.hbm_bytes_per_token = 3.200000e+01 : f64, kda.kernel = "q_scan", parallel = true, reverse = false} : () -> ()
module {
  func.func @q(%x: memref<?x?x?x4xf32> {kda.layout = "token", kda.name = "x", kda.role = "input"}, %o: memref<?x?x?x4xf32> {kda.layout = "token", kda.name = "o", kda.role = "output"}) attributes {kda.chunk_size = 2 : i64, kda.program = "q"} {
    "kda.scan"() ({
    ^bb0(%c: index):
      %x_c = "kda.load"(%x, %c) {head_map = "direct", name = "x"} : (memref<?x?x?x4xf32>, index) -> tensor<2x4xf32>
      %y = "kda.mul"(%x_c, %x_c) : (tensor<2x4xf32>, tensor<2x4xf32>) -> tensor<2x4xf32>
      "kda.store"(%o, %c, %y) {name = "o"} : (memref<?x?x?x4xf32>, index, tensor<2x4xf32>) -> ()
      gpu.yield
    }) {reverse = false} : () -> ()
    return
  }
}

// -----

// The bytes per token need the rows per chunk: the program's kda.chunk_size.
// ERR: Error: pass 'kda-partition' failed: kda-partition: the program function has no kda.chunk_size attribute
module {
  func.func @no_chunk_size(%x: memref<?x?x?x4xf32> {kda.layout = "token", kda.name = "x", kda.role = "input"}) attributes {kda.program = "no_chunk_size"} {
    "kda.scan"() ({
    ^bb0(%c: index):
      %x_c = "kda.load"(%x, %c) {head_map = "direct", name = "x"} : (memref<?x?x?x4xf32>, index) -> tensor<2x4xf32>
      gpu.yield
    }) {reverse = false} : () -> ()
    return
  }
}
