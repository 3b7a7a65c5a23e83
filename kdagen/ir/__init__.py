"""kdagen's IR layer: the ``kda`` MLIR dialect, the Python DSL, the program and gate libraries.

- :mod:`kdagen.ir.dialect` — the dialect (IRDL), ``make_context``, ``parse_module``,
  ``print_module``, ``verify``; the execution model of kda programs; each op's effect and kind
  (``ops_with``), from which the passes and the lowering derive their op sets.
- :mod:`kdagen.ir.accessors` — ``program_func``, ``arg_specs``, the module's target
  (``kda.target``: ``set_target``, ``module_target``).
- :mod:`kdagen.ir.dsl` — tiles with operators, op functions, ``ProgramBuilder``.
- :mod:`kdagen.ir.gates` — gates as DSL functions with declared output ranges (``define_gate``).
- :mod:`kdagen.ir.programs` — ``kda_fwd``, ``kda_bwd``, ``gdn_fwd``, ``gdn_bwd``
  (``build_program``, ``list_programs``).
- :mod:`kdagen.ir.autodiff` — reverse-mode differentiation of kda programs (backward = derived).
- :mod:`kdagen.ir.transforms` — CSE / DCE.
- :mod:`kdagen.ir.testing` — random inputs and float64 references named like program arguments.

The CPU interpreter (the semantic oracle) is :mod:`kdagen.interpreter`.
"""
