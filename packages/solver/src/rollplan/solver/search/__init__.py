"""The planner's searches, on the core floor (``rollplan.solver.core``) only: ``state`` (the incremental
decision state every search prices moves with), ``placement`` (the greedy: role configurations and
longest-first placement), ``local`` (the local search: ``improve`` and ``repair``), ``disaggregate``
(role counts -> roles per slot and a placement; length packing). Nothing is imported here.
"""
