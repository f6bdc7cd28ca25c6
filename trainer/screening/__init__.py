"""Label screening: the trainer's side of data trust (docs/screening.md).

- `rule.py`: the label-error rule on tensors (confident learning): thresholds, likely errors, tallies.
- `phase.py`: the run's first phase: screen the version's new pairs with the accepted model.
- `screener.py`: the accepted model as the judge: probabilities and scene embeddings per pair.
- `scores.py`: the candidate and the accepted model scored per batch and on the trusted set.
- `report.py`: the run report's "New data" section (verdicts, pictures, each drop's impact).
"""
