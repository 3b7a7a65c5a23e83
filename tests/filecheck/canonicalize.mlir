// RUN: kdagen opt %s -p 'canonicalize' | filecheck %s
// RUN: kdagen opt %s -p 'canonicalize{cse=false}' | filecheck %s --check-prefix=NOCSE

// canonicalize is MLIR's canonicalizer followed by CSE (cse=false: the canonicalizer alone).

// Constants fold, and the folded ops go.
// CHECK-LABEL: func.func @fold() -> index
// CHECK-NEXT:    %[[C:.*]] = arith.constant 3 : index
// CHECK-NEXT:    return %[[C]] : index
// CHECK-NEXT:  }
module {
  func.func @fold() -> index {
    %c1 = arith.constant 1 : index
    %c2 = arith.constant 2 : index
    %s = arith.addi %c1, %c2 : index
    %t = arith.muli %s, %c1 : index
    return %t : index
  }
}

// -----

// CSE merges the two equal products; the unused sum goes in both modes.
// CHECK-LABEL: func.func @dup
// CHECK-NEXT:    %[[P:.*]] = arith.muli %a, %b : index
// CHECK-NEXT:    return %[[P]], %[[P]] : index, index
// NOCSE-LABEL: func.func @dup
// NOCSE-NEXT:    %[[P:.*]] = arith.muli %a, %b : index
// NOCSE-NEXT:    %[[Q:.*]] = arith.muli %a, %b : index
// NOCSE-NEXT:    return %[[P]], %[[Q]] : index, index
module {
  func.func @dup(%a: index, %b: index) -> (index, index) {
    %p = arith.muli %a, %b : index
    %q = arith.muli %a, %b : index
    %dead = arith.addi %a, %b : index
    return %p, %q : index, index
  }
}

// -----

// kda ops (IRDL-defined: no folders, no side-effect interface) are left as they are, even a
// dead one or a duplicate; the arith ops beside them still fold. (Pins today's behaviour: the
// kda pipelines do not run canonicalize and rely on the kda passes' own dce.)
// CHECK-LABEL: func.func @kda_untouched
// CHECK:         "kda.scan"() ({
// CHECK:           %[[A:.*]] = "kda.mul"(%[[X:[^,]*]], %[[X]])
// CHECK-NEXT:      %[[B:.*]] = "kda.mul"(%[[X]], %[[X]])
// CHECK-NEXT:      "kda.neg"(%[[X]])
// CHECK-NEXT:      %[[Y:.*]] = "kda.add"(%[[A]], %[[B]])
// CHECK-NEXT:      "kda.store"(%o, %{{.*}}, %[[Y]])
// CHECK:         }) {reverse = false} : () -> ()
// CHECK-NOT:     arith.
// CHECK:         return
module {
  func.func @kda_untouched(%x: memref<?x?x?x4xf32> {kda.layout = "token", kda.name = "x", kda.role = "input"}, %o: memref<?x?x?x4xf32> {kda.layout = "token", kda.name = "o", kda.role = "output"}) attributes {kda.chunk_size = 2 : i64, kda.program = "kda_untouched"} {
    "kda.scan"() ({
    ^bb0(%c: index):
      %x_c = "kda.load"(%x, %c) {head_map = "direct", name = "x"} : (memref<?x?x?x4xf32>, index) -> tensor<2x4xf32>
      %a = "kda.mul"(%x_c, %x_c) : (tensor<2x4xf32>, tensor<2x4xf32>) -> tensor<2x4xf32>
      %b = "kda.mul"(%x_c, %x_c) : (tensor<2x4xf32>, tensor<2x4xf32>) -> tensor<2x4xf32>
      %dead = "kda.neg"(%x_c) : (tensor<2x4xf32>) -> tensor<2x4xf32>
      %y = "kda.add"(%a, %b) : (tensor<2x4xf32>, tensor<2x4xf32>) -> tensor<2x4xf32>
      "kda.store"(%o, %c, %y) {name = "o"} : (memref<?x?x?x4xf32>, index, tensor<2x4xf32>) -> ()
      gpu.yield
    }) {reverse = false} : () -> ()
    %c1 = arith.constant 1 : index
    %unused = arith.addi %c1, %c1 : index
    return
  }
}
