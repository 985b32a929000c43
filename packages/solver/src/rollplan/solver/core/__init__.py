"""The solver's core floor: everything the searches, the MILP/CP-SAT model and the backends stand on.

``instance`` (snapshot -> coefficients), ``pricing`` (every price, written once), ``evaluate`` (a decision's
objective), ``bounds`` (lower bounds), ``actions`` (decision -> actions -> Plan), ``validate`` (the
independent re-check), ``tables`` (per slot type x trajectory coefficient tables for the searches).
Modules here import nothing from ``rollplan.solver.search``, ``.model``, ``.backends`` or ``.api``
(``tests/solver/test_imports.py`` checks it). Nothing is imported here.
"""
