"""Operator tools: what `retrain data status`, `purge`, `audit` and the trust commands (`held`,
`release`, `hold`, `benchmark`: `trust.py`) do. (The declared permissions that the template is
checked against are the tests' own: `tests/permissions.py`.)

They read and change the deployed system through the same data layer as the functions
(`functions/data/`), but no Lambda imports them, so they live here with the CLI and are never in
a Lambda package. Each takes its clients as arguments and knows nothing of a command line: the
CLI and the tests call the same code.
"""
