"""The training-job request: built from a `JobConfig` and a dataset version, refused with a reason
when SageMaker could not run it, validated against botocore's model before it leaves, and the
Debugger rule results of a finished job normalised into `functions.common.rules.RulesFile`.

No torch and no SageMaker SDK here: the StartTraining Lambda imports this package.
"""
