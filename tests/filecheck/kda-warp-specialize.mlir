// RUN: kdagen opt %s -p 'kda-warp-specialize' | filecheck %s
// RUN: kdagen opt %s -p 'kda-warp-specialize{depth=4,smem_budget=100,reserved_smem=0}' | filecheck %s --check-prefix=DEPTH
// RUN: kdagen opt %s -p 'kda-warp-specialize{smem_budget=40,reserved_smem=0}' | filecheck %s --check-prefix=TILE
// RUN: not kdagen opt %s -p 'kda-warp-specialize{smem_budget=20,reserved_smem=0}' 2>&1 | filecheck %s --check-prefix=NOSLOT
// RUN: not kdagen opt %s -p 'kda-warp-specialize' 2>&1 | filecheck %s --check-prefix=ERR

// A kernel scan (kda.kernel, as kda-partition leaves it) with two chunk loads, k (32 bytes)
// and v (16 bytes): both become producer loads into ring slots 0 and 1; each consumer use
// goes through a pipeline_wait on the slot, released after the use; every other op is
// consumer work. The stage is 48 bytes, the ring 2 stages deep.
// CHECK-LABEL: func.func @w
// CHECK:         %[[K:.*]] = "kda.load"(%k, %{{.*}}) {head_map = "direct", kda.role = "producer", kda.slot = 0 : i64, name = "k"}
// CHECK-NEXT:    %[[V:.*]] = "kda.load"(%v, %{{.*}}) {head_map = "direct", kda.role = "producer", kda.slot = 1 : i64, name = "v"}
// CHECK-NEXT:    %[[KW:.*]] = "kda.pipeline_wait"(%[[K]]) {kda.role = "consumer", slot = 0 : i64}
// CHECK-NEXT:    %[[KK:.*]] = "kda.mul"(%[[KW]], %[[KW]]) {kda.role = "consumer"}
// CHECK-NEXT:    "kda.pipeline_release"(%[[KW]]) {kda.role = "consumer", slot = 0 : i64}
// CHECK-NEXT:    %[[VW:.*]] = "kda.pipeline_wait"(%[[V]]) {kda.role = "consumer", slot = 1 : i64}
// CHECK-NEXT:    %[[Y:.*]] = "kda.dot"(%[[VW]], %[[KK]]) {kda.role = "consumer", transpose_lhs = false, transpose_rhs = false}
// CHECK-NEXT:    "kda.pipeline_release"(%[[VW]]) {kda.role = "consumer", slot = 1 : i64}
// CHECK-NEXT:    "kda.store"(%o, %{{.*}}, %[[Y]]) {kda.role = "consumer", name = "o"}
// CHECK-NEXT:    gpu.yield
// CHECK-NEXT:  }) {kda.kernel = "w_chunk", kda.pipeline = {consumer_registers = 232 : i64, consumer_warpgroups = 2 : i64, depth = 2 : i64, mode = "chunk", producer_registers = 40 : i64, producer_warpgroups = 1 : i64, ring_bytes = 96 : i64, slots = 2 : i64, stage_bytes = 48 : i64}, parallel = true, reverse = false}
// With 100 bytes of shared memory, a ring 4 stages deep does not fit: it shrinks to 2.
// DEPTH-LABEL: func.func @w
// DEPTH:         kda.pipeline = {{{.*}}depth = 2 : i64, mode = "chunk", {{.*}}ring_bytes = 96 : i64, slots = 2 : i64, stage_bytes = 48 : i64}
// With 40 bytes not even one 48-byte stage fits: a ring of one 32-byte slot (the largest
// tile) that both loads take in turn.
// TILE-LABEL:  func.func @w
// TILE:          "kda.load"(%k, {{.*}}kda.slot = 0 : i64
// TILE-NEXT:     "kda.load"(%v, {{.*}}kda.slot = 0 : i64
// TILE:          kda.pipeline = {{{.*}}depth = 0 : i64, mode = "tile", {{.*}}ring_bytes = 32 : i64, slots = 1 : i64, stage_bytes = 32 : i64}
// With 20 bytes not even one slot fits.
// NOSLOT: Error: pass 'kda-warp-specialize{smem_budget=20,reserved_smem=0}' failed: kda-warp-specialize: kernel w_chunk has a 32-byte tile but only 20 of the 20-byte budget are left after 0 reserved: not even one ring slot fits; lower reserved_smem or use a smaller chunk
module {
  func.func @w(%k: memref<?x?x?x4xf32> {kda.layout = "token", kda.name = "k", kda.role = "input"}, %v: memref<?x?x?x2xf32> {kda.layout = "token", kda.name = "v", kda.role = "input"}, %o: memref<?x?x?x4xf32> {kda.layout = "token", kda.name = "o", kda.role = "output"}) attributes {kda.chunk_size = 2 : i64, kda.program = "w"} {
    "kda.scan"() ({
    ^bb0(%c: index):
      %k_c = "kda.load"(%k, %c) {head_map = "direct", name = "k"} : (memref<?x?x?x4xf32>, index) -> tensor<2x4xf32>
      %v_c = "kda.load"(%v, %c) {head_map = "direct", name = "v"} : (memref<?x?x?x2xf32>, index) -> tensor<2x2xf32>
      %kk = "kda.mul"(%k_c, %k_c) : (tensor<2x4xf32>, tensor<2x4xf32>) -> tensor<2x4xf32>
      %y = "kda.dot"(%v_c, %kk) {transpose_lhs = false, transpose_rhs = false} : (tensor<2x2xf32>, tensor<2x4xf32>) -> tensor<2x4xf32>
      "kda.store"(%o, %c, %y) {name = "o"} : (memref<?x?x?x4xf32>, index, tensor<2x4xf32>) -> ()
      gpu.yield
    }) {kda.kernel = "w_chunk", parallel = true, reverse = false} : () -> ()
    return
  }
}

// -----

// A state kernel: the workspace tile (load_chunk) is a producer load; the math on the carried
// state is consumer work; ops outside the kernel scan get no role.
// CHECK-LABEL: func.func @st
// CHECK:         %[[S0:.*]] = "kda.load_state"(%h0) {name = "h0"}
// CHECK-NEXT:    %w_ws = "kda.workspace"() {layout = "chunk", name = "w_ws"}
// CHECK-NEXT:    "kda.scan"(%[[S0]]) ({
// CHECK-NEXT:    ^bb0(%[[C:.*]]: index, %[[S:.*]]: tensor<4x4xf32>):
// CHECK-NEXT:      %[[W:.*]] = "kda.load_chunk"(%w_ws, %[[C]]) {kda.role = "producer", kda.slot = 0 : i64, name = "w"}
// CHECK-NEXT:      %[[WW:.*]] = "kda.pipeline_wait"(%[[W]]) {kda.role = "consumer", slot = 0 : i64}
// CHECK-NEXT:      %[[D:.*]] = "kda.dot"(%[[WW]], %[[WW]]) {kda.role = "consumer", transpose_lhs = true, transpose_rhs = false}
// CHECK-NEXT:      "kda.pipeline_release"(%[[WW]]) {kda.role = "consumer", slot = 0 : i64}
// CHECK-NEXT:      %[[SN:.*]] = "kda.add"(%[[S]], %[[D]]) {kda.role = "consumer"}
// CHECK-NEXT:      gpu.yield %[[SN]]
// CHECK-NEXT:    }) {kda.kernel = "st_state", kda.pipeline = {{{.*}}mode = "chunk"{{.*}}stage_bytes = 32 : i64}, parallel = false, reverse = false}
// CHECK-NEXT:    "kda.store_state"(%hT, %{{.*}}) {name = "hT"}
module {
  func.func @st(%h0: memref<?x?x4x4xf32> {kda.layout = "state", kda.name = "h0", kda.role = "input"}, %hT: memref<?x?x4x4xf32> {kda.layout = "state", kda.name = "hT", kda.role = "output"}) attributes {kda.chunk_size = 2 : i64, kda.program = "st"} {
    %S0 = "kda.load_state"(%h0) {name = "h0"} : (memref<?x?x4x4xf32>) -> tensor<4x4xf32>
    %w_ws = "kda.workspace"() {layout = "chunk", name = "w_ws"} : () -> memref<?x?x2x4xf32>
    %S_final = "kda.scan"(%S0) ({
    ^bb0(%c: index, %S: tensor<4x4xf32>):
      %w = "kda.load_chunk"(%w_ws, %c) {name = "w"} : (memref<?x?x2x4xf32>, index) -> tensor<2x4xf32>
      %d = "kda.dot"(%w, %w) {transpose_lhs = true, transpose_rhs = false} : (tensor<2x4xf32>, tensor<2x4xf32>) -> tensor<4x4xf32>
      %S_next = "kda.add"(%S, %d) : (tensor<4x4xf32>, tensor<4x4xf32>) -> tensor<4x4xf32>
      gpu.yield %S_next : tensor<4x4xf32>
    }) {kda.kernel = "st_state", parallel = false, reverse = false} : (tensor<4x4xf32>) -> tensor<4x4xf32>
    "kda.store_state"(%hT, %S_final) {name = "hT"} : (memref<?x?x4x4xf32>, tensor<4x4xf32>) -> ()
    return
  }
}

// -----

// A tile used by two ops is released after the later one (the module docstring: "after its
// last use kda.pipeline_release"). Regression: _guard_uses once ordered the users with a dict
// keyed by operations, whose hashes change when operands are rewritten, so the release landed
// after the first user (kda_fwd_state: G_C; kda_bwd: 7 of 32 tiles).
// CHECK-LABEL: func.func @two_uses
// CHECK:         %[[KW:.*]] = "kda.pipeline_wait"
// CHECK:         "kda.add"({{.*}}%[[KW]]
// CHECK-NEXT:    "kda.pipeline_release"(%[[KW]])
module {
  func.func @two_uses(%k: memref<?x?x?x4xf32> {kda.layout = "token", kda.name = "k", kda.role = "input"}, %o: memref<?x?x?x4xf32> {kda.layout = "token", kda.name = "o", kda.role = "output"}) attributes {kda.chunk_size = 2 : i64, kda.program = "two_uses"} {
    "kda.scan"() ({
    ^bb0(%c: index):
      %k_c = "kda.load"(%k, %c) {head_map = "direct", name = "k"} : (memref<?x?x?x4xf32>, index) -> tensor<2x4xf32>
      %kk = "kda.mul"(%k_c, %k_c) : (tensor<2x4xf32>, tensor<2x4xf32>) -> tensor<2x4xf32>
      %e = "kda.neg"(%kk) : (tensor<2x4xf32>) -> tensor<2x4xf32>
      %z = "kda.add"(%e, %k_c) : (tensor<2x4xf32>, tensor<2x4xf32>) -> tensor<2x4xf32>
      "kda.store"(%o, %c, %z) {name = "o"} : (memref<?x?x?x4xf32>, index, tensor<2x4xf32>) -> ()
      gpu.yield
    }) {kda.kernel = "two_uses_chunk", parallel = true, reverse = false} : () -> ()
    return
  }
}

// -----

// Roles are per kernel: a scan that kda-partition has not made a kernel is an error.
// ERR: Error: pass 'kda-warp-specialize' failed: kda-warp-specialize: no kernel scans; run kda-partition first
module {
  func.func @not_partitioned(%k: memref<?x?x?x4xf32> {kda.layout = "token", kda.name = "k", kda.role = "input"}) attributes {kda.chunk_size = 2 : i64, kda.program = "not_partitioned"} {
    "kda.scan"() ({
    ^bb0(%c: index):
      %k_c = "kda.load"(%k, %c) {head_map = "direct", name = "k"} : (memref<?x?x?x4xf32>, index) -> tensor<2x4xf32>
      gpu.yield
    }) {reverse = false} : () -> ()
    return
  }
}
