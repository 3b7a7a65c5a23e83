// RUN: kdagen opt %s -p 'kda-assign-layouts{atom=wgmma}' | filecheck %s
// RUN: kdagen opt %s -p 'kda-assign-layouts{atom=mma_sync}' | filecheck %s --check-prefix=MMA
// RUN: not kdagen opt %s -p 'kda-assign-layouts' 2>&1 | filecheck %s --check-prefix=ERR

// A serial scan shaped like the forward recurrence (S' = S * decay + krᵀ·(u - w·S)): the
// carried state goes in accumulators transposed (acc_t, Sᵀ), w·S is computed as Sᵀ·wᵀ with
// the state as the register A operand, v' = u - w·S stays in those fragments and is the A
// operand of krᵀ·v' in place; kr, which that product reads transposed, is stored transposed by
// its writer (the workspace's kda.tile_layout), and the only conversion in the step is u read
// from shared memory into v''s fragments (512 bytes a chunk; and the initial state, once per
// CTA, into Sᵀ's: 1 KB each way through shared memory). At most 4 KB of tiles are live in
// registers at once (at the last add: Sᵀ, Sᵀ·decay, krᵀ·v' and the next Sᵀ) and 1600 bytes in
// shared memory (the three TMA boxes and the decay vector). The decay vector is broadcast from shared memory.
// CHECK-LABEL: func.func @recurrence{{.*}}kda.mma_atom = "wgmma"
// CHECK:         %[[KR:.*]] = "kda.workspace"() {kda.tile_layout = "smem_t", layout = "chunk", name = "kr_ws"}
// CHECK:         %[[W:.*]] = "kda.workspace"() {layout = "chunk", name = "w_ws"}
// CHECK:         "kda.convert_layout"(%h0) {kda.tile_layout = "acc_t", to = "acc_t"}
// CHECK:         "kda.load_chunk"(%[[KR]], %{{.*}}) {kda.role = "producer", kda.slot = 0 : i64, kda.tile_layout = "smem_t", name = "kr"}
// CHECK:         "kda.load_chunk"(%[[W]], %{{.*}}) {kda.role = "producer", kda.slot = 1 : i64, kda.tile_layout = "smem", name = "w"}
// CHECK:         %[[WS:.*]] = "kda.dot"(%{{.*}}, %{{.*}}) {kda.precision = "tf32", kda.tile_layout = "acc_t"
// CHECK:         %[[UC:.*]] = "kda.convert_layout"(%{{.*}}) {kda.tile_layout = "acc_t", to = "acc_t"}
// CHECK-NEXT:    %[[VN:.*]] = "kda.sub"(%[[UC]], %[[WS]]) {kda.tile_layout = "acc_t"}
// CHECK:         "kda.broadcast"(%{{.*}}) {dims = array<i64: 1>, kda.tile_layout = "any"}
// CHECK:         "kda.mul"({{.*}}) {kda.tile_layout = "acc_t"}
// CHECK-NOT:     kda.convert_layout
// CHECK:         "kda.dot"(%{{.*}}, %[[VN]]) {kda.precision = "tf32", kda.tile_layout = "acc_t", transpose_lhs = true
// CHECK:         "kda.add"({{.*}}) {kda.tile_layout = "acc_t"}
// CHECK-NOT:     kda.convert_layout
// CHECK:         gpu.yield
// CHECK:         kda.carried_layouts = ["acc_t"], kda.kernel = "state", kda.layout_cost = {conversion_bytes = 512 : i64, conversions = 1 : i64, init_bytes = 2048 : i64, init_conversions = 1 : i64, register_bytes = 4096 : i64, shared_bytes = 1600 : i64}
// mma.sync takes B in registers: the B operands are loaded into B fragments (opb).
// MMA-LABEL: func.func @recurrence{{.*}}kda.mma_atom = "mma_sync"
// MMA:         "kda.convert_layout"({{.*}}) {kda.tile_layout = "opb", to = "opb"}
// MMA:         "kda.dot"
// Without a target on the module the atom must be given.
// ERR: the module has no target (run kda-bind-target first) and no atom option; pass atom=wgmma or atom=mma_sync
module {
  func.func @recurrence(%h0: tensor<16x16xf32>) -> tensor<16x16xf32> {
    %kr_ws = "kda.workspace"() {layout = "chunk", name = "kr_ws"} : () -> memref<?x?x8x16xf32>
    %w_ws = "kda.workspace"() {layout = "chunk", name = "w_ws"} : () -> memref<?x?x8x16xf32>
    %u_ws = "kda.workspace"() {layout = "chunk", name = "u_ws"} : () -> memref<?x?x8x16xf32>
    %d_ws = "kda.workspace"() {layout = "chunk", name = "d_ws"} : () -> memref<?x?x16xf32>
    %S = "kda.scan"(%h0) ({
    ^bb0(%c: index, %s: tensor<16x16xf32>):
      %kr = "kda.load_chunk"(%kr_ws, %c) {kda.role = "producer", kda.slot = 0 : i64, name = "kr"} : (memref<?x?x8x16xf32>, index) -> tensor<8x16xf32>
      %w = "kda.load_chunk"(%w_ws, %c) {kda.role = "producer", kda.slot = 1 : i64, name = "w"} : (memref<?x?x8x16xf32>, index) -> tensor<8x16xf32>
      %u = "kda.load_chunk"(%u_ws, %c) {kda.role = "producer", kda.slot = 2 : i64, name = "u"} : (memref<?x?x8x16xf32>, index) -> tensor<8x16xf32>
      %d = "kda.load_chunk"(%d_ws, %c) {kda.role = "producer", kda.slot = 3 : i64, name = "d"} : (memref<?x?x16xf32>, index) -> tensor<16xf32>
      %ws = "kda.dot"(%w, %s) {kda.precision = "tf32", transpose_lhs = false, transpose_rhs = false} : (tensor<8x16xf32>, tensor<16x16xf32>) -> tensor<8x16xf32>
      %vn = "kda.sub"(%u, %ws) : (tensor<8x16xf32>, tensor<8x16xf32>) -> tensor<8x16xf32>
      %db = "kda.broadcast"(%d) {dims = array<i64: 1>} : (tensor<16xf32>) -> tensor<16x16xf32>
      %sd = "kda.mul"(%s, %db) : (tensor<16x16xf32>, tensor<16x16xf32>) -> tensor<16x16xf32>
      %kv = "kda.dot"(%kr, %vn) {kda.precision = "tf32", transpose_lhs = true, transpose_rhs = false} : (tensor<8x16xf32>, tensor<8x16xf32>) -> tensor<16x16xf32>
      %next = "kda.add"(%sd, %kv) : (tensor<16x16xf32>, tensor<16x16xf32>) -> tensor<16x16xf32>
      gpu.yield %next : tensor<16x16xf32>
    }) {kda.kernel = "state", parallel = false, reverse = false} : (tensor<16x16xf32>) -> tensor<16x16xf32>
    return %S : tensor<16x16xf32>
  }
}
