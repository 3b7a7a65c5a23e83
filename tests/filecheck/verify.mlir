// RUN: kdagen opt %s -p 'verify' | filecheck %s
// RUN: not kdagen opt %s --no-verify-on-parse -p 'verify' 2>&1 | filecheck %s --check-prefix=ERR

// The kda shape rules that IRDL cannot express are checked by the verify pass (and by the
// parser, which --no-verify-on-parse turns off so that malformed input reaches the pass).

// A well-formed program passes and is printed unchanged.
// IDENTITY: verify changes nothing in a module that verifies
// CHECK-LABEL: func.func @ok
// CHECK-NEXT:    %[[X:.*]] = "kda.load_head"(%x) {name = "x"} : (memref<?x4xf32>) -> tensor<4xf32>
// CHECK-NEXT:    %[[Y:.*]] = "kda.neg"(%[[X]]) : (tensor<4xf32>) -> tensor<4xf32>
// CHECK-NEXT:    "kda.store_state"(%y, %[[Y]]) {name = "y"}
// CHECK-NEXT:    return
module {
  func.func @ok(%x: memref<?x4xf32> {kda.layout = "head", kda.name = "x", kda.role = "input"}, %y: memref<?x?x4xf32> {kda.layout = "state", kda.name = "y", kda.role = "output"}) {
    %x_h = "kda.load_head"(%x) {name = "x"} : (memref<?x4xf32>) -> tensor<4xf32>
    %n = "kda.neg"(%x_h) : (tensor<4xf32>) -> tensor<4xf32>
    "kda.store_state"(%y, %n) {name = "y"} : (memref<?x?x4xf32>, tensor<4xf32>) -> ()
    return
  }
}

// -----

// A matmul of a [2, 4] tile by a [2, 4] tile (no transpose) has no [2, 2] result.
// ERR: Error: pass 'verify' failed: kda.dot: dot shapes [2, 4] @ [2, 4] -> [2, 2]
// ERR-NEXT: at: %{{.*}} = "kda.dot"
// ERR-NEXT: IR before the pass:
module {
  func.func @bad_dot(%x: memref<?x2x4xf32> {kda.layout = "head", kda.name = "x", kda.role = "input"}) {
    %x_h = "kda.load_head"(%x) {name = "x"} : (memref<?x2x4xf32>) -> tensor<2x4xf32>
    %p = "kda.dot"(%x_h, %x_h) {transpose_lhs = false, transpose_rhs = false} : (tensor<2x4xf32>, tensor<2x4xf32>) -> tensor<2x2xf32>
    return
  }
}

// -----

// A broadcast whose dims do not take the operand's shape to the result's.
// ERR: Error: pass 'verify' failed: kda.broadcast: shape [4] is not [3, 4] without dims [1]
module {
  func.func @bad_broadcast(%x: memref<?x4xf32> {kda.layout = "head", kda.name = "x", kda.role = "input"}) {
    %x_h = "kda.load_head"(%x) {name = "x"} : (memref<?x4xf32>) -> tensor<4xf32>
    %b = "kda.broadcast"(%x_h) {dims = array<i64: 1>} : (tensor<4xf32>) -> tensor<3x4xf32>
    return
  }
}

// -----

// A state pool: load_state / store_state take the slot table (an [N] int memref) as an
// optional last operand, slot_valid gives the rank-0 check of the sequence's slot.
// IDENTITY: verify changes nothing in a module that verifies
// CHECK-LABEL: func.func @pool
// CHECK-NEXT:    %[[L:.*]] = "kda.slot_valid"(%slots) : (memref<?xi32>) -> tensor<i1>
// CHECK-NEXT:    %[[H:.*]] = "kda.load_state"(%pool, %slots) {name = "pool"} : (memref<?x?x4xf32>, memref<?xi32>) -> tensor<4xf32>
// CHECK-NEXT:    "kda.store_state"(%pool_out, %[[H]], %slots) {name = "pool_out"}
module {
  func.func @pool(%pool: memref<?x?x4xf32> {kda.layout = "pool", kda.name = "pool", kda.role = "input"}, %slots: memref<?xi32> {kda.layout = "slots", kda.name = "slots", kda.role = "input"}, %pool_out: memref<?x?x4xf32> {kda.layout = "pool", kda.name = "pool_out", kda.role = "output"}) {
    %live = "kda.slot_valid"(%slots) : (memref<?xi32>) -> tensor<i1>
    %h = "kda.load_state"(%pool, %slots) {name = "pool"} : (memref<?x?x4xf32>, memref<?xi32>) -> tensor<4xf32>
    "kda.store_state"(%pool_out, %h, %slots) {name = "pool_out"} : (memref<?x?x4xf32>, tensor<4xf32>, memref<?xi32>) -> ()
    return
  }
}

// -----

// A slot table holds one int slot per sequence: a float or 2-D one is refused.
// ERR: Error: pass 'verify' failed: kda.load_state: slots must be an [N] memref of i32 or i64, got memref<?xf32>
module {
  func.func @bad_slots(%pool: memref<?x?x4xf32> {kda.layout = "pool", kda.name = "pool", kda.role = "input"}, %slots: memref<?xf32> {kda.layout = "slots", kda.name = "slots", kda.role = "input"}) {
    %h = "kda.load_state"(%pool, %slots) {name = "pool"} : (memref<?x?x4xf32>, memref<?xf32>) -> tensor<4xf32>
    return
  }
}
