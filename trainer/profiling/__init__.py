"""Profiling without SageMaker Debugger: a system monitor, step timelines, rules and a report.

- `monitor.py`: one sampler per host writes Debugger's own system-metric records;
- `steps.py`: every rank appends one line per step (data wait, compute, communication), TRAIN
  or EVAL (a validation batch);
- `rules/`: Debugger's built-in profiler rules, plus DataStall and LossNotDecreasing, one module
  per family of rules;
- `report.py`: `rules.json` and a self-contained `report.html`; `rerender.py`: a run's report
  rendered again after the run (`python -m trainer.profiling.rerender OUTPUT_DIR`);
- `jsonl.py`, `store.py`: the files read as they grow, and held in columns (`columns.py`): the
  one form the rules and the report read (bounded bytes per record, only appended lines parsed);
- `session.py`: the `Profiler` the training loop drives; `flags.py`: its hyperparameters.
"""
