"""Policy: what a route's profile allows, and the evaluator that applies it.

``model`` holds the frozen policy types (pure), ``load`` turns a YAML file into them through
the protobuf schema in ``protos/``, ``pressure`` computes the pressure score and level, and
``evaluate`` runs the degradation ladder.
"""
