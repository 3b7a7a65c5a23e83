// RUN: kdagen opt %s -p 'kda-share-chunk-values' | filecheck %s

// Two chunk-parallel kernels compute A = k kᵀ, its inverse and w = A⁻¹ k from the input k.
// The first already stores w (for another kernel: its layout is that kernel's choice); the
// second uses w and, elsewhere, the inverse. The first now also stores both into fp32
// workspaces of their own, and the second loads them; A, once only the inverse used it, is no
// longer computed there.
// CHECK-LABEL: func.func @twice
// CHECK:         %[[WS:.*]] = "kda.workspace"() {layout = "chunk", name = "w_ws"}
// CHECK-DAG:     %[[AWS:.*]] = "kda.workspace"() {layout = "chunk", name = "Ainv_ws"} : () -> memref<?x?x2x2xf32>
// CHECK-DAG:     %[[WS1:.*]] = "kda.workspace"() {layout = "chunk", name = "w1_ws"} : () -> memref<?x?x2x4xf32>
// CHECK:         "kda.scan"() ({
// CHECK:           %[[AI:.*]] = "kda.tril_inv"
// CHECK-NEXT:      %[[W:.*]] = "kda.dot"(%[[AI]]
// CHECK-NEXT:      "kda.store_chunk"(%[[WS]], %{{.*}}, %[[W]]) {name = "w"}
// CHECK-DAG:       "kda.store_chunk"(%[[AWS]], %{{.*}}, %[[AI]]) {name = "Ainv"}
// CHECK-DAG:       "kda.store_chunk"(%[[WS1]], %{{.*}}, %[[W]]) {name = "w1"}
// CHECK:           gpu.yield
// CHECK:         kda.kernel = "twice_chunk"
// CHECK:         "kda.scan"() ({
// CHECK-NEXT:    ^bb0(%[[C:.*]]: index):
// CHECK-NOT:       "kda.tril_inv"
// CHECK-DAG:       %[[AL:.*]] = "kda.load_chunk"(%[[AWS]], %[[C]]) {name = "Ainv"}
// CHECK-DAG:       %[[WL:.*]] = "kda.load_chunk"(%[[WS1]], %[[C]]) {name = "w1"}
// CHECK-NOT:       "kda.tril_inv"
// CHECK:           "kda.add"(%[[WL]], %{{.*}})
// CHECK:           "kda.dot"(%[[AL]], %{{.*}})
// CHECK:         kda.hbm_bytes_per_token = 5.600000e+01 : f64, kda.kernel = "twice_out"
module {
  func.func @twice(%k: memref<?x?x?x4xf32> {kda.layout = "token", kda.name = "k", kda.role = "input"}, %o: memref<?x?x?x4xf32> {kda.layout = "token", kda.name = "o", kda.role = "output"}) attributes {kda.chunk_size = 2 : i64, kda.program = "twice"} {
    %w_ws = "kda.workspace"() {layout = "chunk", name = "w_ws"} : () -> memref<?x?x2x4xf32>
    "kda.scan"() ({
    ^bb0(%c: index):
      %k_c = "kda.load"(%k, %c) {head_map = "direct", name = "k"} : (memref<?x?x?x4xf32>, index) -> tensor<2x4xf32>
      %A = "kda.dot"(%k_c, %k_c) {transpose_lhs = false, transpose_rhs = true} : (tensor<2x4xf32>, tensor<2x4xf32>) -> tensor<2x2xf32>
      %Ainv = "kda.tril_inv"(%A) : (tensor<2x2xf32>) -> tensor<2x2xf32>
      %w = "kda.dot"(%Ainv, %k_c) {transpose_lhs = false, transpose_rhs = false} : (tensor<2x2xf32>, tensor<2x4xf32>) -> tensor<2x4xf32>
      "kda.store_chunk"(%w_ws, %c, %w) {name = "w"} : (memref<?x?x2x4xf32>, index, tensor<2x4xf32>) -> ()
      gpu.yield
    }) {kda.hbm_bytes_per_token = 2.400000e+01 : f64, kda.kernel = "twice_chunk", parallel = true, reverse = false} : () -> ()
    "kda.scan"() ({
    ^bb0(%c: index):
      %k_c = "kda.load"(%k, %c) {head_map = "direct", name = "k"} : (memref<?x?x?x4xf32>, index) -> tensor<2x4xf32>
      %A = "kda.dot"(%k_c, %k_c) {transpose_lhs = false, transpose_rhs = true} : (tensor<2x4xf32>, tensor<2x4xf32>) -> tensor<2x2xf32>
      %Ainv = "kda.tril_inv"(%A) : (tensor<2x2xf32>) -> tensor<2x2xf32>
      %w = "kda.dot"(%Ainv, %k_c) {transpose_lhs = false, transpose_rhs = false} : (tensor<2x2xf32>, tensor<2x4xf32>) -> tensor<2x4xf32>
      %y = "kda.add"(%w, %k_c) : (tensor<2x4xf32>, tensor<2x4xf32>) -> tensor<2x4xf32>
      %z = "kda.dot"(%Ainv, %y) {transpose_lhs = false, transpose_rhs = false} : (tensor<2x2xf32>, tensor<2x4xf32>) -> tensor<2x4xf32>
      "kda.store"(%o, %c, %z) {name = "o"} : (memref<?x?x?x4xf32>, index, tensor<2x4xf32>) -> ()
      gpu.yield
    }) {kda.hbm_bytes_per_token = 3.200000e+01 : f64, kda.kernel = "twice_out", parallel = true, reverse = false} : () -> ()
    return
  }
}

// -----

// IDENTITY: nothing qualifies for sharing (the only product reads a written workspace)
// A value computed from a workspace never matches: another kernel may write the workspace
// between the two (here the state kernel between them writes x_ws), so the second chunk
// kernel keeps its own product.
// CHECK-LABEL: func.func @written
// CHECK:         kda.kernel = "written_state"
// CHECK:         "kda.scan"() ({
// CHECK:           %[[X:.*]] = "kda.load_chunk"
// CHECK-NEXT:      "kda.dot"(%[[X]], %[[X]])
// CHECK-NOT:       "kda.load_chunk"
// CHECK:         kda.kernel = "written_out"
module {
  func.func @written(%k: memref<?x?x?x4xf32> {kda.layout = "token", kda.name = "k", kda.role = "input"}, %o: memref<?x?x?x2xf32> {kda.layout = "token", kda.name = "o", kda.role = "output"}, %h0: memref<?x?x4x4xf32> {kda.layout = "state", kda.name = "h0", kda.role = "input"}) attributes {kda.chunk_size = 2 : i64, kda.program = "written"} {
    %x_ws = "kda.workspace"() {layout = "chunk", name = "x_ws"} : () -> memref<?x?x2x4xf32>
    %S0 = "kda.load_state"(%h0) {name = "h0"} : (memref<?x?x4x4xf32>) -> tensor<4x4xf32>
    "kda.scan"() ({
    ^bb0(%c: index):
      %x = "kda.load_chunk"(%x_ws, %c) {name = "x"} : (memref<?x?x2x4xf32>, index) -> tensor<2x4xf32>
      %A = "kda.dot"(%x, %x) {transpose_lhs = false, transpose_rhs = true} : (tensor<2x4xf32>, tensor<2x4xf32>) -> tensor<2x2xf32>
      %z = "kda.dot"(%A, %x) {transpose_lhs = false, transpose_rhs = false} : (tensor<2x2xf32>, tensor<2x4xf32>) -> tensor<2x4xf32>
      "kda.store"(%o, %c, %A) {name = "o"} : (memref<?x?x?x2xf32>, index, tensor<2x2xf32>) -> ()
      gpu.yield
    }) {kda.hbm_bytes_per_token = 1.600000e+01 : f64, kda.kernel = "written_chunk", parallel = true, reverse = false} : () -> ()
    %S_final = "kda.scan"(%S0) ({
    ^bb0(%c: index, %S: tensor<4x4xf32>):
      %k_c = "kda.load"(%k, %c) {head_map = "direct", name = "k"} : (memref<?x?x?x4xf32>, index) -> tensor<2x4xf32>
      %t = "kda.dot"(%k_c, %S) {transpose_lhs = false, transpose_rhs = false} : (tensor<2x4xf32>, tensor<4x4xf32>) -> tensor<2x4xf32>
      "kda.store_chunk"(%x_ws, %c, %t) {name = "x"} : (memref<?x?x2x4xf32>, index, tensor<2x4xf32>) -> ()
      gpu.yield %S : tensor<4x4xf32>
    }) {kda.hbm_bytes_per_token = 1.600000e+01 : f64, kda.kernel = "written_state", parallel = false, reverse = false} : (tensor<4x4xf32>) -> tensor<4x4xf32>
    "kda.scan"() ({
    ^bb0(%c: index):
      %x = "kda.load_chunk"(%x_ws, %c) {name = "x"} : (memref<?x?x2x4xf32>, index) -> tensor<2x4xf32>
      %A = "kda.dot"(%x, %x) {transpose_lhs = false, transpose_rhs = true} : (tensor<2x4xf32>, tensor<2x4xf32>) -> tensor<2x2xf32>
      "kda.store"(%o, %c, %A) {name = "o"} : (memref<?x?x?x2xf32>, index, tensor<2x2xf32>) -> ()
      gpu.yield
    }) {kda.hbm_bytes_per_token = 1.600000e+01 : f64, kda.kernel = "written_out", parallel = true, reverse = false} : () -> ()
    return
  }
}

// -----

// A workspace written before both chunk kernels, and by nothing between them, holds the same
// tile for both: the second kernel loads the first one's product instead of recomputing it
// (the backward's dk kernel and dq kernel both read the state checkpoints, w and u).
// CHECK-LABEL: func.func @written_before
// CHECK:         kda.kernel = "written_before_state"
// CHECK:         %[[P:.*]] = "kda.workspace"() {layout = "chunk", name = "A_ws"} : () -> memref<?x?x2x2xf32>
// CHECK:         "kda.scan"() ({
// CHECK:           %[[A:.*]] = "kda.dot"
// CHECK:           "kda.store_chunk"(%[[P]], %{{.*}}, %[[A]]) {name = "A"}
// CHECK:         kda.kernel = "written_before_chunk"
// CHECK:         "kda.scan"() ({
// CHECK-NOT:       "kda.dot"
// CHECK:           %[[L:.*]] = "kda.load_chunk"(%[[P]], %{{.*}}) {name = "A"}
// CHECK-NEXT:      "kda.mul"(%[[L]], %[[L]])
// CHECK:         kda.kernel = "written_before_out"
module {
  func.func @written_before(%k: memref<?x?x?x4xf32> {kda.layout = "token", kda.name = "k", kda.role = "input"}, %o: memref<?x?x?x2xf32> {kda.layout = "token", kda.name = "o", kda.role = "output"}, %o2: memref<?x?x?x2xf32> {kda.layout = "token", kda.name = "o2", kda.role = "output"}, %h0: memref<?x?x4x4xf32> {kda.layout = "state", kda.name = "h0", kda.role = "input"}) attributes {kda.chunk_size = 2 : i64, kda.program = "written_before"} {
    %x_ws = "kda.workspace"() {layout = "chunk", name = "x_ws"} : () -> memref<?x?x2x4xf32>
    %S0 = "kda.load_state"(%h0) {name = "h0"} : (memref<?x?x4x4xf32>) -> tensor<4x4xf32>
    %S_final = "kda.scan"(%S0) ({
    ^bb0(%c: index, %S: tensor<4x4xf32>):
      %k_c = "kda.load"(%k, %c) {head_map = "direct", name = "k"} : (memref<?x?x?x4xf32>, index) -> tensor<2x4xf32>
      %t = "kda.dot"(%k_c, %S) {transpose_lhs = false, transpose_rhs = false} : (tensor<2x4xf32>, tensor<4x4xf32>) -> tensor<2x4xf32>
      "kda.store_chunk"(%x_ws, %c, %t) {name = "x"} : (memref<?x?x2x4xf32>, index, tensor<2x4xf32>) -> ()
      gpu.yield %S : tensor<4x4xf32>
    }) {kda.hbm_bytes_per_token = 1.600000e+01 : f64, kda.kernel = "written_before_state", parallel = false, reverse = false} : (tensor<4x4xf32>) -> tensor<4x4xf32>
    "kda.scan"() ({
    ^bb0(%c: index):
      %x = "kda.load_chunk"(%x_ws, %c) {name = "x"} : (memref<?x?x2x4xf32>, index) -> tensor<2x4xf32>
      %A = "kda.dot"(%x, %x) {transpose_lhs = false, transpose_rhs = true} : (tensor<2x4xf32>, tensor<2x4xf32>) -> tensor<2x2xf32>
      "kda.store"(%o, %c, %A) {name = "o"} : (memref<?x?x?x2xf32>, index, tensor<2x2xf32>) -> ()
      gpu.yield
    }) {kda.hbm_bytes_per_token = 1.600000e+01 : f64, kda.kernel = "written_before_chunk", parallel = true, reverse = false} : () -> ()
    "kda.scan"() ({
    ^bb0(%c: index):
      %x = "kda.load_chunk"(%x_ws, %c) {name = "x"} : (memref<?x?x2x4xf32>, index) -> tensor<2x4xf32>
      %A = "kda.dot"(%x, %x) {transpose_lhs = false, transpose_rhs = true} : (tensor<2x4xf32>, tensor<2x4xf32>) -> tensor<2x2xf32>
      %B = "kda.mul"(%A, %A) : (tensor<2x2xf32>, tensor<2x2xf32>) -> tensor<2x2xf32>
      "kda.store"(%o2, %c, %B) {name = "o2"} : (memref<?x?x?x2xf32>, index, tensor<2x2xf32>) -> ()
      gpu.yield
    }) {kda.hbm_bytes_per_token = 1.600000e+01 : f64, kda.kernel = "written_before_out", parallel = true, reverse = false} : () -> ()
    return
  }
}

// -----

// IDENTITY: a kernel between the two writes a workspace of the same name (one buffer at run time)
// The runtime allocates workspaces by name, so a write to another workspace op named x_ws is
// a write to the buffer both chunk kernels read: nothing is shared.
// CHECK-LABEL: func.func @aliased
// CHECK:         kda.kernel = "aliased_between"
// CHECK:         "kda.scan"() ({
// CHECK:           "kda.dot"
// CHECK-NOT:       "kda.load_chunk"
// CHECK:         kda.kernel = "aliased_out"
module {
  func.func @aliased(%k: memref<?x?x?x4xf32> {kda.layout = "token", kda.name = "k", kda.role = "input"}, %o: memref<?x?x?x2xf32> {kda.layout = "token", kda.name = "o", kda.role = "output"}, %o2: memref<?x?x?x2xf32> {kda.layout = "token", kda.name = "o2", kda.role = "output"}) attributes {kda.chunk_size = 2 : i64, kda.program = "aliased"} {
    %x_ws = "kda.workspace"() {layout = "chunk", name = "x_ws"} : () -> memref<?x?x2x4xf32>
    %x_ws2 = "kda.workspace"() {layout = "chunk", name = "x_ws"} : () -> memref<?x?x2x4xf32>
    "kda.scan"() ({
    ^bb0(%c: index):
      %x = "kda.load_chunk"(%x_ws, %c) {name = "x"} : (memref<?x?x2x4xf32>, index) -> tensor<2x4xf32>
      %A = "kda.dot"(%x, %x) {transpose_lhs = false, transpose_rhs = true} : (tensor<2x4xf32>, tensor<2x4xf32>) -> tensor<2x2xf32>
      "kda.store"(%o, %c, %A) {name = "o"} : (memref<?x?x?x2xf32>, index, tensor<2x2xf32>) -> ()
      gpu.yield
    }) {kda.hbm_bytes_per_token = 1.600000e+01 : f64, kda.kernel = "aliased_chunk", parallel = true, reverse = false} : () -> ()
    "kda.scan"() ({
    ^bb0(%c: index):
      %k_c = "kda.load"(%k, %c) {head_map = "direct", name = "k"} : (memref<?x?x?x4xf32>, index) -> tensor<2x4xf32>
      "kda.store_chunk"(%x_ws2, %c, %k_c) {name = "x"} : (memref<?x?x2x4xf32>, index, tensor<2x4xf32>) -> ()
      gpu.yield
    }) {kda.hbm_bytes_per_token = 1.600000e+01 : f64, kda.kernel = "aliased_between", parallel = true, reverse = false} : () -> ()
    "kda.scan"() ({
    ^bb0(%c: index):
      %x = "kda.load_chunk"(%x_ws, %c) {name = "x"} : (memref<?x?x2x4xf32>, index) -> tensor<2x4xf32>
      %A = "kda.dot"(%x, %x) {transpose_lhs = false, transpose_rhs = true} : (tensor<2x4xf32>, tensor<2x4xf32>) -> tensor<2x2xf32>
      "kda.store"(%o2, %c, %A) {name = "o2"} : (memref<?x?x?x2xf32>, index, tensor<2x2xf32>) -> ()
      gpu.yield
    }) {kda.hbm_bytes_per_token = 1.600000e+01 : f64, kda.kernel = "aliased_out", parallel = true, reverse = false} : () -> ()
    return
  }
}
