"""The stack's AWS endpoint: moto, and what it lacks. Emulators for the calls moto cannot serve,
on botocore's hooks (`emulators.py`), served over HTTP to other processes (`gateway.py`); writes
throttled inside moto's backends (`faults.py`); the stack's own clients (`clients.py`); and the
file that tells other terminals where the endpoint is (`discovery.py`)."""
