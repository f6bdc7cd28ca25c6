"""The Lambda runtime: the real handlers of `functions/` invoked as Lambda invokes them.

`contract.py` is what a function is and what its handler receives and returns; `lambdas.py` the
runtime (in this process, or in worker processes: `workers.py` starts and speaks to them,
`worker_process.py` is their entry point, `protocol.py` the messages between the two);
`poller.py` plays the SQS event-source mappings and `ticker.py` the schedules."""
