// RUN: kdagen opt %s -p 'kda-autodiff' | filecheck %s
// RUN: kdagen opt %s -p 'kda-autodiff{program=s_grad}' | filecheck %s --check-prefix=NAME
// RUN: not kdagen opt %s -p 'kda-autodiff' 2>&1 | filecheck %s --check-prefix=ERR

// o = x * x, chunk by chunk: the backward takes the cotangent do, gives dx = do*x + do*x in a
// reverse scan, and keeps the forward as @f_primal (kda.primal).
// CHECK-LABEL: func.func @f_bwd(%x: memref<?x?x?x4xf32> {kda.layout = "token", kda.name = "x", kda.role = "input"}, %do: memref<?x?x?x4xf32> {kda.cotangent_of = "o", {{.*}}kda.role = "input"}, %dx: memref<?x?x?x4xf32> {kda.gradient_of = "x", {{.*}}kda.role = "output"}) attributes {kda.chunk_size = 2 : i64, kda.derived_from = "f", kda.program = "f_bwd"}
// CHECK:         "kda.scan"() ({
// CHECK:         %[[X:.*]] = "kda.load"(%x, %[[C:.*]]) {head_map = "direct", name = "x"}
// CHECK-NEXT:    %[[DO:.*]] = "kda.load"(%do, %[[C]]) {head_map = "direct", name = "do"}
// CHECK-NEXT:    %[[D:.*]] = "kda.mul"(%[[DO]], %[[X]])
// CHECK-NEXT:    %[[DX:.*]] = "kda.add"(%[[D]], %[[D]])
// CHECK-NEXT:    "kda.store"(%dx, %[[C]], %[[DX]]) {name = "dx"}
// CHECK-NEXT:    gpu.yield
// CHECK-NEXT:  }) {reverse = true} : () -> ()
// CHECK-LABEL: func.func @f_primal(%x: {{.*}}, %o: {{.*}}) attributes {kda.chunk_size = 2 : i64, kda.primal, kda.program = "f"}
// CHECK:         %[[Y:.*]] = "kda.mul"
// CHECK-NEXT:    "kda.store"(%o, %{{.*}}, %[[Y]]) {name = "o"}
module {
  func.func @f(%x: memref<?x?x?x4xf32> {kda.layout = "token", kda.name = "x", kda.role = "input"}, %o: memref<?x?x?x4xf32> {kda.layout = "token", kda.name = "o", kda.role = "output"}) attributes {kda.chunk_size = 2 : i64, kda.program = "f"} {
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

// A scan carrying a state S (o = k S, S += k^T k): the backward recomputes the forward scan,
// storing the state entering each chunk (S_chunks), then runs a reverse scan carrying dS from
// dhT, reloading S per chunk; dS at the first chunk is dh0 (the grad_name of h0).
// CHECK-LABEL: func.func @s_bwd(%k: {{.*}}, %h0: {{.*}}, %do: {{.*}}, %dhT: {{.*}}, %dk: {{.*}}, %dh0: {{.*}})
// CHECK:         %[[S0:.*]] = "kda.load_state"(%h0)
// CHECK-NEXT:    %[[WS:.*]] = "kda.workspace"() {layout = "chunk", name = "S_chunks"} : () -> memref<?x?x4x4xf32>
// CHECK-NEXT:    "kda.scan"(%[[S0]]) ({
// CHECK-NEXT:    ^bb0(%[[C:.*]]: index, %[[S:.*]]: tensor<4x4xf32>):
// CHECK-NEXT:      "kda.store_chunk"(%[[WS]], %[[C]], %[[S]]) {name = "S"}
// CHECK-NOT:       "kda.store"(%o
// CHECK:         }) {reverse = false}
// CHECK-NEXT:    %[[DHT:.*]] = "kda.load_state"(%dhT)
// CHECK-NEXT:    %[[DS0:.*]] = "kda.scan"(%[[DHT]]) ({
// CHECK-NEXT:    ^bb0(%[[C2:.*]]: index, %[[DS:.*]]: tensor<4x4xf32>):
// CHECK-NEXT:      "kda.load_chunk"(%[[WS]], %[[C2]]) {name = "S"}
// CHECK:           "kda.store"(%dk, %[[C2]], %{{.*}}) {name = "dk"}
// CHECK-NEXT:      gpu.yield %{{.*}} : tensor<4x4xf32>
// CHECK-NEXT:    }) {reverse = true}
// CHECK-NEXT:    "kda.store_state"(%dh0, %[[DS0]]) {name = "dh0"}
// CHECK-LABEL: func.func @s_primal
// NAME-LABEL:  func.func @s_grad(
// NAME-SAME:     kda.derived_from = "s", kda.program = "s_grad"
// NAME-LABEL:  func.func @s_primal
module {
  func.func @s(%k: memref<?x?x?x4xf32> {kda.layout = "token", kda.name = "k", kda.role = "input"}, %h0: memref<?x?x4x4xf32> {kda.grad_name = "dh0", kda.layout = "state", kda.name = "h0", kda.role = "input"}, %o: memref<?x?x?x4xf32> {kda.layout = "token", kda.name = "o", kda.role = "output"}, %hT: memref<?x?x4x4xf32> {kda.grad_name = "dhT", kda.layout = "state", kda.name = "hT", kda.role = "output"}) attributes {kda.chunk_size = 2 : i64, kda.program = "s"} {
    %S0 = "kda.load_state"(%h0) {name = "h0"} : (memref<?x?x4x4xf32>) -> tensor<4x4xf32>
    %S_final = "kda.scan"(%S0) ({
    ^bb0(%c: index, %S: tensor<4x4xf32>):
      %k_c = "kda.load"(%k, %c) {head_map = "direct", name = "k"} : (memref<?x?x?x4xf32>, index) -> tensor<2x4xf32>
      %o_c = "kda.dot"(%k_c, %S) {transpose_lhs = false, transpose_rhs = false} : (tensor<2x4xf32>, tensor<4x4xf32>) -> tensor<2x4xf32>
      "kda.store"(%o, %c, %o_c) {name = "o"} : (memref<?x?x?x4xf32>, index, tensor<2x4xf32>) -> ()
      %kk = "kda.dot"(%k_c, %k_c) {transpose_lhs = true, transpose_rhs = false} : (tensor<2x4xf32>, tensor<2x4xf32>) -> tensor<4x4xf32>
      %S_next = "kda.add"(%S, %kk) : (tensor<4x4xf32>, tensor<4x4xf32>) -> tensor<4x4xf32>
      gpu.yield %S_next : tensor<4x4xf32>
    }) {reverse = false} : (tensor<4x4xf32>) -> tensor<4x4xf32>
    "kda.store_state"(%hT, %S_final) {name = "hT"} : (memref<?x?x4x4xf32>, tensor<4x4xf32>) -> ()
    return
  }
}

// -----

// A module that already holds a backward (a kda.primal function) is not differentiated again.
// ERR: Error: pass 'kda-autodiff' failed: kda-autodiff: the module is already a backward program
module {
  func.func @g_bwd() {
    return
  }
  func.func @g_primal() attributes {kda.chunk_size = 2 : i64, kda.primal, kda.program = "g"} {
    return
  }
}

// -----

// Each differentiable input may be loaded once (its adjoint is one store).
// ERR: Error: pass 'kda-autodiff' failed: autodiff: input 'x' is loaded 2 times; each differentiable input must be loaded once
module {
  func.func @twice(%x: memref<?x4xf32> {kda.layout = "head", kda.name = "x", kda.role = "input"}, %y: memref<?x?x4xf32> {kda.layout = "state", kda.name = "y", kda.role = "output"}) attributes {kda.chunk_size = 2 : i64, kda.program = "twice"} {
    %a = "kda.load_head"(%x) {name = "x"} : (memref<?x4xf32>) -> tensor<4xf32>
    %b = "kda.load_head"(%x) {name = "x"} : (memref<?x4xf32>) -> tensor<4xf32>
    %s = "kda.add"(%a, %b) : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
    "kda.store_state"(%y, %s) {name = "y"} : (memref<?x?x4xf32>, tensor<4xf32>) -> ()
    return
  }
}
