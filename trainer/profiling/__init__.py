"""Profiling without SageMaker Debugger: a system monitor, step timelines, rules and a report.

- `monitor.py`: one sampler per host writes Debugger's own system-metric records;
- `steps.py`: every rank appends one line per step (data wait, compute, communication);
- `rules.py`: Debugger's built-in profiler rules, plus DataStall and LossNotDecreasing;
- `report.py`: `rules.json` and a self-contained `report.html`.
- `session.py`: the `Profiler` the training loop drives; `flags.py`: its hyperparameters.
"""
