"""The offline stack: `template.yaml` deployed on moto, on this machine.

`cloudformation/` reads the template and runs the stack's life cycle; `lambda_runtime/`,
`sagemaker/` and `fsx/` play the services moto does not run; `events/` delivers what services
emit (EventBridge, S3 notifications) and what the team receives; `endpoint/` is the AWS endpoint
all of them answer on. `demo.py` is `make run`."""
