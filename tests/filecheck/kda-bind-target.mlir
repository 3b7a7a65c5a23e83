// RUN: kdagen opt %s -p 'kda-bind-target' | filecheck %s
// RUN: kdagen opt %s -p 'kda-bind-target{chip=sm_120a}' | filecheck %s --check-prefix=SM120
// RUN: not kdagen opt %s -p 'kda-bind-target{chip=sm_90a}' 2>&1 | filecheck %s --check-prefix=ERR

// kda-bind-target records the chip on the module; the passes after it read their budgets
// from it (default chip sm_90a).
// CHECK: module attributes {kda.target = "sm_90a"}
// CHECK-LABEL: func.func @f
// SM120: module attributes {kda.target = "sm_120a"}
// SM120-LABEL: func.func @f
module {
  func.func @f() {
    return
  }
}

// -----

// Binding the chip a module already has changes nothing.
// IDENTITY: the module is already bound to the chip asked for
// CHECK: module attributes {kda.target = "sm_90a"}
// CHECK-LABEL: func.func @bound
module attributes {kda.target = "sm_90a"} {
  func.func @bound() {
    return
  }
}

// -----

// A module compiled for one chip cannot be re-bound to another.
// ERR: kda-bind-target: the module is already compiled for sm_120a, not sm_90a
module attributes {kda.target = "sm_120a"} {
  func.func @other() {
    return
  }
}
