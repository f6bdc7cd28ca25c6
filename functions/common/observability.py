"""Logger, Tracer and Metrics, set up the same way for every function.

Powertools reads the service name, namespace and log level from the environment the template
gives each function, so call `for_function()` at module level in a handler module: on AWS that is
the cold start; the offline stack imports each handler module inside that function's environment.
"""

from __future__ import annotations

from aws_lambda_powertools import Logger, Metrics, Tracer

METRICS_NAMESPACE = "Retrain"


def for_function() -> tuple[Logger, Tracer, Metrics]:
    return Logger(), Tracer(), Metrics(namespace=METRICS_NAMESPACE)
