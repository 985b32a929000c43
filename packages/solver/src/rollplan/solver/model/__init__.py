"""The MILP / CP-SAT model, on the core floor only: ``formulation`` (the solver-neutral builder protocol and
the exact per-trajectory model) and ``aggregate`` (slot groups x trajectory classes: the large instances'
decision model and LP bound). Written once for both ``milp`` and ``cpsat``. Nothing is imported here.
"""
