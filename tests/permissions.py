"""What each function and role of template.yaml may do on AWS, and why: least privilege, written down.

The template's `Policies` must grant exactly these (action, resource) pairs, no more and no less
(tests/unit/test_permissions.py), and every AWS call the functions make during an offline
retraining run must be allowed by the template's statements of the function that made it
(tests/integration/test_least_privilege.py). A new call in a function's code therefore fails a
test until it is added here and to the template, with its reason.

Only the tests read this (with `tests/iam.py`, the IAM model they check it with), so it lives
beside them and ships in no package; `make typecheck` still checks it, as a grant's tuples are
easy to get wrong (a missing comma makes a string).

Resources are written with placeholders, filled in from the template by the tests:

    {bucket}              arn:aws:s3:::<data bucket>            (objects: {bucket}/<prefix>*)
    {ledger} {idempotency} the two DynamoDB tables' ARNs          ({ledger}/index/state: its GSI)
    {intake_queue}        the intake's SQS queue's ARN
    {key}                 the DataKey's ARN (bucket SSE-KMS, topic, training volumes and output)
    {topic} {secret}      the notification topic, the Slack webhook secret
    {trigger} ...         a function's ARN (see FUNCTION_PLACEHOLDERS)
    {state_machine} {executions}  the retraining state machine, and its executions
    {jobs}                this stack's training jobs (training-job/retrain-<stack id>-*)
    {model_package_group} {model_packages}  the model package group, and its versions
    {file_system} {fsx_tasks}  the dataset's FSx file system, and data repository tasks
    {training_role} {report_reader_role}  the roles passed or assumed
    {ledger_backup_vault} the AWS Backup vault of the ledger's copies (LedgerBackupRetentionDays)
    {pytorch_registry} {debugger_rules_registry}  AWS's registry accounts of the region's images
    {lock}                the run lock's partition key (LOCK_PK, functions/data/ledger_batches.py)
    {run_ended_failures}  RunEndedFunction's on-failure destination queue
    {region} {account} {partition} {stack_name}

`${{aws:PrincipalTag/retrain-team}}` is an IAM policy variable, written doubled so that the
placeholders leave it as `${aws:PrincipalTag/retrain-team}`: the principal's team.

`conditions` names the condition keys a grant's statement must carry, as `Operator:key` (any value) or
`Operator:key=value`; the integration test checks their values against the calls themselves.

`DENIALS` are the explicit Deny statements of a principal's policies, declared the same way: what
must stay refused even if an Allow is widened later (the intake decodes untrusted images: it must
never take the run lock, write a run's evidence, or write a pair's trust).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Grant:
    actions: tuple[str, ...]
    resources: tuple[str, ...]
    why: str
    conditions: tuple[str, ...] = ()


VIA_S3 = ("StringEquals:kms:ViaService=s3.{region}.amazonaws.com",)
S3_READ_KEY = Grant(
    ("kms:Decrypt",),
    ("{key}",),
    "objects in the bucket are SSE-KMS with the DataKey: reading one decrypts its data key (via S3 only)",
    VIA_S3,
)
S3_WRITE_KEY = Grant(
    ("kms:GenerateDataKey",),
    ("{key}",),
    "writing an object under SSE-KMS asks KMS for a data key (via S3 only)",
    VIA_S3,
)
# The ledger partitions the intake keeps (functions/data/ledger_*.py): a batch's files, pairs and
# report records (`batch#<batch>`), and content claims (`content#<sha256>`).
INTAKE_PARTITIONS = "ForAllValues:StringLike:dynamodb:LeadingKeys=batch#*,content#*"
# The batches' trust items (`trust#<batch>`, functions/data/ledger_trust.py): written only by the
# evaluation (a run's screening) and by a person (TrustOperatorRole); the intake reads them.
TRUST_PARTITIONS = "ForAllValues:StringLike:dynamodb:LeadingKeys=trust#*"
TRUST_WRITES = (
    "dynamodb:PutItem",
    "dynamodb:UpdateItem",
    "dynamodb:DeleteItem",
    "dynamodb:BatchWriteItem",
    "dynamodb:PartiQLInsert",
    "dynamodb:PartiQLUpdate",
    "dynamodb:PartiQLDelete",
)
MISSING_IS_404 = (
    "S3 answers a read of a missing key 404 (not 403) only to a caller that may list the bucket; "
    "the code tells 'not there' from a failure by it"
)
# The runs' items (`run#<run>`): a run's job name, and its end with the one message's state
# (functions/data/ledger_jobs.py, ledger_run_ends.py).
RUN_PARTITIONS = "ForAllValues:StringLike:dynamodb:LeadingKeys=run#*"
# The principal's team (its retrain-team tag) must be one of the stack's AnnotationTeams.
TEAM = ("StringEquals:aws:PrincipalTag/retrain-team",)
LEDGER_RW = ("dynamodb:GetItem", "dynamodb:PutItem", "dynamodb:UpdateItem", "dynamodb:Query")

FUNCTION_PLACEHOLDERS = {
    "IntakeFunction": "intake",
    "SweeperFunction": "sweeper",
    "TriggerFunction": "trigger",
    "ReleaseFunction": "release",
    "PrepareRunFunction": "prepare_run",
    "DatasetSyncFunction": "dataset_sync",
    "TrainingJobFunction": "training_job",
    "EvaluateRunFunction": "evaluate_run",
    "NotifyFunction": "notify",
    "RunEndedFunction": "run_ended",
}

PERMISSIONS: dict[str, tuple[Grant, ...]] = {
    "IntakeFunction": (
        Grant(
            ("s3:GetObjectVersion",),
            ("{bucket}/incoming/*", "{bucket}/quarantine/*"),
            "reads an upload by the VersionId its event names (the bucket is versioned, so every event names "
            "one); copies it (or, re-judged with a new partner, its quarantined copy)",
        ),
        Grant(
            ("s3:PutObject",),
            (
                "{bucket}/dataset/images/*",
                "{bucket}/dataset/labels/*",
                "{bucket}/quarantine/*",
                "{bucket}/reports/batches/*",
            ),
            "curated copies, quarantined copies and their .reason.json, and the batch reports (never manifests)",
        ),
        Grant(
            ("s3:AbortMultipartUpload",),
            ("{bucket}/dataset/images/*", "{bucket}/dataset/labels/*", "{bucket}/quarantine/*"),
            "a copy above 5 GiB goes in parts (authorised as PutObject); a failed one is aborted",
        ),
        Grant(
            ("s3:DeleteObjectVersion",),
            ("{bucket}/incoming/*", "{bucket}/quarantine/*"),
            "removes a landing copy by VersionId once copied, and a quarantined copy and its reason once curated",
        ),
        Grant(
            ("s3:ListBucketVersions",),
            ("{bucket}",),
            "finds every version of a quarantined file's .reason.json to delete it (quarantine/ only)",
            ("StringLike:s3:prefix",),
        ),
        Grant(("s3:ListBucket",), ("{bucket}",), MISSING_IS_404 + " (an upload withdrawn before the intake read it)"),
        Grant(
            ("kms:Decrypt", "kms:GenerateDataKey"),
            ("{key}",),
            "reads and copies SSE-KMS objects, writes new ones (via S3 only)",
            VIA_S3,
        ),
        Grant(
            LEDGER_RW,
            ("{ledger}",),
            "the ledger: files, pairs, batches and content claims, in their partitions only (not its index, "
            "not the run lock, run or job records, not trust)",
            (INTAKE_PARTITIONS,),
        ),
        Grant(
            ("dynamodb:GetItem",),
            ("{ledger}",),
            "a batch's report shows its pairs' trust: it reads the batch's trust item, never writes it (DENIALS)",
            (TRUST_PARTITIONS,),
        ),
        Grant(
            ("dynamodb:GetItem", "dynamodb:PutItem", "dynamodb:UpdateItem", "dynamodb:DeleteItem"),
            ("{idempotency}",),
            "Powertools idempotency records: one per object version",
        ),
        Grant(("lambda:InvokeFunction",), ("{trigger}",), "kicks the trigger when a batch closes"),
        Grant(
            ("sqs:SendMessage",),
            ("{intake_queue}",),
            "a record left unstarted for lack of time goes back to the queue as a new message, so waiting "
            "costs it none of its maxReceiveCount tries",
        ),
        Grant(
            ("sqs:DeleteMessage",),
            ("{intake_queue}",),
            "before a record delivered before is started, the finished ones are deleted (DeleteMessageBatch): "
            "should it end the invocation, they do not come back with it",
        ),
    ),
    "SweeperFunction": (
        Grant(
            ("s3:GetObjectVersion",),
            ("{bucket}/incoming/*",),
            "copies the lone file of an incomplete pair, by VersionId, to quarantine/",
        ),
        Grant(
            ("s3:PutObject",),
            ("{bucket}/quarantine/*", "{bucket}/reports/batches/*"),
            "the quarantined copy and its .reason.json; the reports of the batches it closed",
        ),
        Grant(
            ("s3:AbortMultipartUpload",),
            ("{bucket}/quarantine/*",),
            "a copy above 5 GiB goes in parts; a failed one is aborted",
        ),
        Grant(
            ("s3:DeleteObjectVersion",),
            ("{bucket}/incoming/*",),
            "removes the landing copy by VersionId once its quarantine copy is confirmed",
        ),
        Grant(("kms:Decrypt", "kms:GenerateDataKey"), ("{key}",), "copies SSE-KMS objects (via S3 only)", VIA_S3),
        Grant(LEDGER_RW, ("{ledger}",), "closes batches, marks pairs incomplete, reads a batch for its report"),
        Grant(("dynamodb:Query",), ("{ledger}/index/state",), "open batches quiet since, pending pairs seen before"),
        Grant(("lambda:InvokeFunction",), ("{trigger}",), "kicks the trigger when it closed a batch"),
    ),
    "TriggerFunction": (
        Grant(("s3:PutObject",), ("{bucket}/dataset/manifests/*",), "freezes a dataset version: its manifest"),
        Grant(("s3:GetObject",), ("{bucket}/dataset/manifests/*",), "HeadObject: a rerun's manifest exists"),
        Grant(("s3:ListBucket",), ("{bucket}",), MISSING_IS_404 + " (a rerun of a version that has no manifest)"),
        S3_WRITE_KEY,
        Grant(
            LEDGER_RW,
            ("{ledger}",),
            "the lock taken (never freed: ReleaseFunction frees it), closed batches consumed, pairs stamped "
            "with their dataset version",
        ),
        Grant(("dynamodb:Query",), ("{ledger}/index/state",), "closed batches and curated pairs by state"),
        Grant(("states:StartExecution",), ("{state_machine}",), "starts the retraining run"),
        Grant(("states:DescribeExecution",), ("{executions}",), "is the lock holder's run still running?"),
    ),
    "ReleaseFunction": (
        Grant(
            ("dynamodb:DeleteItem",),
            ("{ledger}",),
            "frees the run lock, on condition that the named run holds it; no other item",
            ("ForAllValues:StringEquals:dynamodb:LeadingKeys={lock}",),
        ),
        Grant(
            ("dynamodb:PutItem",),
            ("{ledger}",),
            "records the run's end, its message owed, in the release's transaction (a caller that still tells "
            "the team: the failure branch, RunEndedFunction, a cancel); runs' items only",
            (RUN_PARTITIONS,),
        ),
        Grant(("lambda:InvokeFunction",), ("{trigger}",), "has the trigger look for new data after the release"),
    ),
    "PrepareRunFunction": (
        Grant(
            ("s3:GetObject",),
            ("{bucket}/dataset/manifests/*", "{bucket}/models/accepted.json", "{bucket}/code/current.json"),
            "the run's manifest, the accepted model, the manifest it was trained on, and the released "
            "trainer's sha256, fixed for the run when it starts",
        ),
        Grant(("s3:ListBucket",), ("{bucket}",), MISSING_IS_404 + " (no accepted model before the first run)"),
        S3_READ_KEY,
        Grant(
            ("dynamodb:GetItem", "dynamodb:PutItem"),
            ("{ledger}",),
            "its execution must hold the run lock: reads it, takes a free one (a conditional write)",
        ),
        Grant(("states:DescribeExecution",), ("{executions}",), "is the lock holder's run still running?"),
    ),
    "DatasetSyncFunction": (
        Grant(
            ("fsx:CreateDataRepositoryTask",),
            ("{file_system}", "{fsx_tasks}"),
            "imports dataset/ into the file system (authorised on the file system and the new task)",
        ),
        Grant(
            ("fsx:DescribeDataRepositoryTasks", "fsx:CancelDataRepositoryTask"),
            ("{fsx_tasks}",),
            "follows the import; cancels one that outlived its timeout",
        ),
    ),
    "TrainingJobFunction": (
        Grant(
            ("sagemaker:CreateTrainingJob",),
            ("{jobs}",),
            "starts the run's job: only in the training subnets and security groups, network isolated, "
            "DataKey-encrypted volumes and output, and encrypted traffic between its instances",
            (
                "ForAllValues:StringEquals:sagemaker:VpcSubnets",
                "ForAllValues:StringEquals:sagemaker:VpcSecurityGroupIds",
                "Null:sagemaker:VpcSubnets",
                "Null:sagemaker:VpcSecurityGroupIds",
                "StringEquals:sagemaker:VolumeKmsKey",
                "StringEquals:sagemaker:OutputKmsKey",
                "Bool:sagemaker:InterContainerTrafficEncryption=true",
                "Bool:sagemaker:NetworkIsolation=true",
            ),
        ),
        Grant(("sagemaker:AddTags",), ("{jobs}",), "CreateTrainingJob with Tags (dataset version, execution, code)"),
        Grant(
            ("sagemaker:DescribeTrainingJob", "sagemaker:StopTrainingJob"),
            ("{jobs}",),
            "follows the job; stops it when the run fails or it overruns, or once its run has ended",
        ),
        Grant(
            ("sagemaker:ListTags",),
            ("{jobs}",),
            "the safety poll reads which run an InProgress job belongs to (its retrain:execution tag)",
        ),
        Grant(
            ("sagemaker:ListTrainingJobs",),
            ("*",),
            "the safety poll lists the InProgress jobs of this stack's name prefix; the action has no "
            "resource-level permissions",
        ),
        Grant(
            ("states:DescribeExecution",),
            ("{executions}",),
            "whether a job's run still runs: after 'Start training' created the job (a run stopped meanwhile has it "
            "stopped), and in the safety poll (a job whose run ended is stopped)",
        ),
        Grant(
            ("iam:PassRole",),
            ("{training_role}",),
            "the job runs as the training role, passed to SageMaker only",
            ("StringEquals:iam:PassedToService=sagemaker.amazonaws.com",),
        ),
        Grant(
            ("s3:GetObject",),
            ("{bucket}/code/*/sourcedir.tar.gz",),
            "reads the run's trainer through and hashes it: no job for code other than the release the run started "
            "with",
        ),
        Grant(("s3:ListBucket",), ("{bucket}",), MISSING_IS_404 + " (the run's trainer was deleted)"),
        S3_READ_KEY,
        Grant(
            ("dynamodb:GetItem", "dynamodb:PutItem", "dynamodb:DeleteItem"),
            ("{ledger}",),
            "each run's job name (found again by a retry and by whatever ends the run); the runs waiting for "
            "a job, with their task tokens, forgotten once answered",
        ),
        Grant(("dynamodb:Query",), ("{ledger}/index/state",), "the safety poll lists every waiting run"),
        Grant(
            ("states:SendTaskSuccess", "states:SendTaskFailure", "states:SendTaskHeartbeat"),
            ("*",),
            "answers a run's wait for its job (and keeps it alive); these actions have no resource-level "
            "permissions: the task token is the authority",
        ),
    ),
    "RunEndedFunction": (
        Grant(("dynamodb:GetItem",), ("{ledger}",), "whose run holds the lock, and the run's job name"),
        Grant(
            ("sagemaker:DescribeTrainingJob", "sagemaker:StopTrainingJob"),
            ("{jobs}",),
            "stops the job of a run stopped from the console or timed out (no Catch ran)",
        ),
        Grant(("states:GetExecutionHistory",), ("{executions}",), "the state the run was in when it ended"),
        Grant(
            ("lambda:InvokeFunction",),
            ("{notify}", "{release}"),
            "the failure branch's message and lock release, reused for the ends that skip it",
        ),
        Grant(
            ("sqs:SendMessage",),
            ("{run_ended_failures}",),
            "its on-failure destination: Lambda sends an event it failed on three times there as this role",
        ),
    ),
    "EvaluateRunFunction": (
        Grant(("sagemaker:DescribeTrainingJob",), ("{jobs}",), "where the finished job put its output"),
        Grant(
            ("sagemaker:CreateModelPackage",),
            ("{model_package_group}", "{model_packages}"),
            "registers an accepted model as a version of the stack's group",
        ),
        Grant(("sagemaker:DescribeModelPackage",), ("{model_packages}",), "a retry finds the package it registered"),
        Grant(
            ("sagemaker:ListModelPackages",),
            ("*",),
            "a retry lists the group's newest packages; ListModelPackages has no resource-level permissions",
        ),
        Grant(
            ("s3:GetObject",),
            (
                "{bucket}/training/*",
                "{bucket}/reports/runs/*",
                "{bucket}/reports/failures/*",
                "{bucket}/models/accepted.json",
                "{bucket}/models/packages/*",
            ),
            "the job's model.tar.gz and output.tar.gz (and Debugger's profiler reports); every run's "
            "summary.json, evaluated or failed, for the runs' history page (reports/index.html); the accepted "
            "model's ETag, which the conditional write of models/accepted.json names; HeadObject of a sealed "
            "model (a retry finds its own copy by its SHA-256)",
        ),
        Grant(
            ("s3:GetObjectVersion",),
            ("{bucket}/training/*",),
            "seals an accepted model from the very version of model.tar.gz it judged, even if a job wrote "
            "the key since",
        ),
        Grant(
            ("s3:ListBucket",),
            ("{bucket}",),
            MISSING_IS_404 + " (a job that wrote no output.tar.gz); lists Debugger's profiler reports and "
            "the runs' summaries",
        ),
        Grant(
            ("s3:PutObject",),
            (
                "{bucket}/reports/runs/*",
                "{bucket}/reports/index.html",
                "{bucket}/reports/batches/*",
                "{bucket}/models/packages/*",
                "{bucket}/models/runs/*",
                "{bucket}/models/accepted.json",
            ),
            "the run's reports (its evidence, which only it writes: DataBucketPolicy), the runs' history page, "
            "a held batch's rewritten report, the accepted model's sealed copy (If-None-Match), its weights "
            "(the next run's warm start), the accepted model",
        ),
        Grant(("kms:Decrypt", "kms:GenerateDataKey"), ("{key}",), "reads and writes SSE-KMS objects", VIA_S3),
        Grant(
            ("dynamodb:PutItem",),
            ("{ledger}",),
            "pairs' trust: holds the pairs screening found wrong (unless a person released them), trusts "
            "the pairs an independent screening passed; written over the revision read",
        ),
        Grant(
            ("dynamodb:GetItem", "dynamodb:Query"),
            ("{ledger}",),
            "a screened batch's report is rewritten from its records (batch, files, pairs, trust)",
        ),
    ),
    "NotifyFunction": (
        Grant(("sns:Publish",), ("{topic}",), "tells the team how the run went"),
        Grant(
            ("kms:GenerateDataKey", "kms:Decrypt"),
            ("{key}",),
            "the topic is encrypted with the DataKey: publishing needs both (via SNS only)",
            ("StringEquals:kms:ViaService=sns.{region}.amazonaws.com",),
        ),
        Grant(("secretsmanager:GetSecretValue",), ("{secret}",), "the Slack webhook URL"),
        Grant(("sts:AssumeRole",), ("{report_reader_role}",), "signs report links with a session of known expiry"),
        Grant(("s3:GetObject",), ("{bucket}/reports/runs/*",), "an evaluated run's summary.json (EvaluateRun's)"),
        Grant(
            ("s3:PutObject",),
            ("{bucket}/reports/failures/*",),
            "the summary.json of a run that ended before its evaluation (never an evaluated run's evidence)",
        ),
        Grant(("kms:Decrypt", "kms:GenerateDataKey"), ("{key}",), "reads and writes SSE-KMS objects", VIA_S3),
        Grant(
            ("states:GetExecutionHistory",),
            ("{executions}",),
            "a failed run's message and summary.json name the state that failed: the last one its execution's "
            "history entered before the failure branch (the branch does not write it into the state)",
        ),
        Grant(
            ("dynamodb:GetItem", "dynamodb:UpdateItem"),
            ("{ledger}",),
            "a run end's message is sent once: claimed, then marked sent (or given back), on the run's end "
            "record; runs' items only",
            (RUN_PARTITIONS,),
        ),
    ),
    "RetrainStateMachine": (
        Grant(
            ("lambda:InvokeFunction",),
            (
                "{prepare_run}",
                "{dataset_sync}",
                "{training_job}",
                "{evaluate_run}",
                "{notify}",
                "{release}",
            ),
            "every Task state invokes one of these functions (the ASL names no other resource)",
        ),
        Grant(
            (
                "logs:CreateLogDelivery",
                "logs:GetLogDelivery",
                "logs:UpdateLogDelivery",
                "logs:DeleteLogDelivery",
                "logs:ListLogDeliveries",
                "logs:PutResourcePolicy",
                "logs:DescribeResourcePolicies",
                "logs:DescribeLogGroups",
            ),
            ("*",),
            "logging to its log group goes through CloudWatch Logs' vended log delivery, which AWS "
            "authorises on Resource '*' only",
        ),
        Grant(
            (
                "xray:PutTraceSegments",
                "xray:PutTelemetryRecords",
                "xray:GetSamplingRules",
                "xray:GetSamplingTargets",
            ),
            ("*",),
            "tracing is on; X-Ray's write actions have no resource-level permissions",
        ),
    ),
    "TrainingRole": (
        Grant(
            ("s3:GetObject",),
            ("{bucket}/code/*/sourcedir.tar.gz", "{bucket}/models/runs/*"),
            "the trainer's code (the release the run checked); the accepted run's weights (the model channel, a "
            "warm start)",
        ),
        Grant(
            ("s3:PutObject",),
            ("{bucket}/training/*",),
            "the job's output: model.tar.gz, output.tar.gz, Debugger's rule output, checkpoints",
        ),
        Grant(
            ("s3:GetObject", "s3:DeleteObject"),
            ("{bucket}/training/checkpoints/*",),
            "checkpoint sync: a restarted job reads its checkpoints back; a replaced one is deleted there too",
        ),
        Grant(("s3:ListBucket",), ("{bucket}",), "SageMaker lists an S3 channel's prefix before downloading it"),
        Grant(
            ("kms:Decrypt", "kms:GenerateDataKey"),
            ("{key}",),
            "reads the SSE-KMS code and weights, writes the output (via S3 only)",
            VIA_S3,
        ),
        Grant(
            ("kms:Encrypt",),
            ("{key}",),
            "SageMaker encrypts the output with OutputDataConfig.KmsKeyId as the role (via S3 only)",
            VIA_S3,
        ),
        Grant(
            ("kms:CreateGrant",),
            ("{key}",),
            "SageMaker attaches the instances' storage volumes encrypted with VolumeKmsKeyId through a grant",
            ("Bool:kms:GrantIsForAWSResource",),
        ),
        Grant(
            ("ecr:GetAuthorizationToken",),
            ("*",),
            "logs in to the registry of AWS's training images; this action has no resource-level permissions",
        ),
        Grant(
            ("ecr:BatchGetImage", "ecr:GetDownloadUrlForLayer", "ecr:BatchCheckLayerAvailability"),
            (
                "arn:{partition}:ecr:{region}:{pytorch_registry}:repository/pytorch-training",
                "arn:{partition}:ecr:{region}:{debugger_rules_registry}:repository/sagemaker-debugger-rules",
            ),
            "pulls the PyTorch training image (and Debugger's rule evaluator) from AWS's registry accounts "
            "only (functions/training_job/images.py), never a look-alike repository of another account",
        ),
        Grant(
            ("logs:CreateLogGroup", "logs:CreateLogStream", "logs:PutLogEvents", "logs:DescribeLogStreams"),
            ("arn:{partition}:logs:{region}:{account}:log-group:/aws/sagemaker/TrainingJobs*",),
            "the job's container logs, in SageMaker's log group",
        ),
        Grant(
            ("cloudwatch:PutMetricData",),
            ("*",),
            "the job's metrics (SageMaker's namespaces only); PutMetricData has no resource-level permissions",
            ("StringLike:cloudwatch:namespace",),
        ),
        Grant(
            (
                "ec2:CreateNetworkInterface",
                "ec2:CreateNetworkInterfacePermission",
                "ec2:DeleteNetworkInterface",
                "ec2:DeleteNetworkInterfacePermission",
                "ec2:DescribeNetworkInterfaces",
                "ec2:DescribeVpcs",
                "ec2:DescribeDhcpOptions",
                "ec2:DescribeSubnets",
                "ec2:DescribeSecurityGroups",
            ),
            ("*",),
            "the instances join the training VPC; SageMaker documents these on '*' (ENIs it names itself)",
        ),
        Grant(("fsx:DescribeFileSystems",), ("{file_system}",), "the instances mount the dataset's file system"),
    ),
    "TrainerReleaseRole": (
        Grant(
            ("s3:PutObject",),
            ("{bucket}/code/*",),
            "releases the trainer: its archive under its sha256 (only where nothing is), then code/current.json; "
            "the bucket policy lets no one else write under code/",
        ),
        Grant(
            ("s3:GetObject",),
            ("{bucket}/code/*/sourcedir.tar.gz",),
            "an archive already at the release's key: the same bytes (a repeated release), or replaced ones it "
            "restores",
        ),
        Grant(
            ("kms:GenerateDataKey", "kms:Decrypt"),
            ("{key}",),
            "writes and reads SSE-KMS objects (via S3 only)",
            VIA_S3,
        ),
    ),
    "ReportReaderRole": (
        Grant(("s3:GetObject",), ("{bucket}/reports/runs/*",), "presigned links open a run's report.html"),
        S3_READ_KEY,
    ),
    "AnnotationUploaderPolicy": (
        Grant(
            ("s3:PutObject",),
            ("{bucket}/incoming/${{aws:PrincipalTag/retrain-team}}-*",),
            "a team uploads its drops as batches named <team>-<anything>, never into another team's",
            TEAM,
        ),
        Grant(
            ("s3:AbortMultipartUpload", "s3:ListMultipartUploadParts"),
            ("{bucket}/incoming/${{aws:PrincipalTag/retrain-team}}-*",),
            "large files go up in parts; a failed multipart upload is aborted (its own batches only)",
            TEAM,
        ),
        Grant(
            ("s3:GetObject",),
            ("{bucket}/reports/batches/${{aws:PrincipalTag/retrain-team}}-*",),
            "what became of its drops: its batches' reports",
            TEAM,
        ),
        Grant(
            ("s3:ListBucket",),
            ("{bucket}",),
            "lists what it uploaded and its reports (its own batches' prefixes only)",
            (*TEAM, "StringLike:s3:prefix"),
        ),
        Grant(
            ("kms:GenerateDataKey", "kms:Decrypt"),
            ("{key}",),
            "uploads under SSE-KMS (a multipart upload decrypts to complete), reads reports (via S3 only)",
            VIA_S3,
        ),
    ),
    "ErasureRole": (
        Grant(
            ("s3:ListBucketVersions",),
            ("{bucket}",),
            "finds every version and delete marker of the pairs to erase (incoming/, dataset/, quarantine/, "
            "reports/ only)",
            ("StringLike:s3:prefix",),
        ),
        Grant(
            ("s3:GetObject", "s3:GetObjectVersion"),
            ("{bucket}/incoming/*", "{bucket}/dataset/*", "{bucket}/quarantine/*"),
            "the sha256 of every version of a named image (its copies elsewhere go too); the manifests to rewrite",
        ),
        Grant(
            ("s3:DeleteObjectVersion",),
            ("{bucket}/incoming/*", "{bucket}/dataset/*", "{bucket}/quarantine/*", "{bucket}/reports/*"),
            "erases every version of the pairs, and the older versions of rewritten manifests and reports "
            "(the only principal the bucket policy lets delete versions under dataset/)",
        ),
        Grant(
            ("s3:PutObject",),
            ("{bucket}/dataset/manifests/*", "{bucket}/reports/*"),
            "manifests without the erased lines, their .purged.json records, the rewritten batch reports",
        ),
        Grant(
            ("s3:ListBucket", "s3:GetLifecycleConfiguration"),
            ("{bucket}",),
            MISSING_IS_404 + " (HeadBucket before it starts); the audit that checks a purge reads the lifecycle rules",
        ),
        Grant(("kms:Decrypt", "kms:GenerateDataKey"), ("{key}",), "reads and writes SSE-KMS objects", VIA_S3),
        Grant(
            (
                "dynamodb:DescribeTable",
                "dynamodb:GetItem",
                "dynamodb:PutItem",
                "dynamodb:DeleteItem",
                "dynamodb:Query",
                "dynamodb:Scan",
            ),
            ("{ledger}",),
            "the ledger's items of the erased pairs and files, every content claim naming the image (a scan), "
            "and the trigger's lock, held while it erases",
        ),
        Grant(("dynamodb:Query",), ("{ledger}/index/state",), "the batches and pairs to look through"),
        Grant(("states:DescribeExecution",), ("{executions}",), "is the run holding the lock still running?"),
        Grant(
            ("cloudformation:DescribeStacks",),
            ("arn:{partition}:cloudformation:{region}:{account}:stack/{stack_name}/*",),
            "`--stack` finds the bucket, the ledger and the state machine in the stack's outputs",
        ),
    ),
    # Only with LedgerBackupRetentionDays > 0; as AWS's AWSBackupServiceRolePolicyForBackup grants
    # for DynamoDB, narrowed to the ledger and its vault.
    "BackupRole": (
        Grant(
            (
                "dynamodb:DescribeTable",
                "dynamodb:CreateBackup",
                "dynamodb:StartAwsBackupJob",
                "dynamodb:ListTagsOfResource",
            ),
            ("{ledger}",),
            "AWS Backup copies the ledger every day: a DynamoDB backup, or its own (with the table's tags)",
        ),
        Grant(
            ("dynamodb:DescribeBackup", "dynamodb:DeleteBackup"),
            ("{ledger}/backup/*",),
            "the plan's lifecycle expires the copies it made as DynamoDB backups",
        ),
        Grant(
            ("backup:DescribeBackupVault", "backup:CopyIntoBackupVault"),
            ("{ledger_backup_vault}",),
            "the copies go into the stack's own vault, nowhere else",
        ),
    ),
    "TrustOperatorRole": (
        Grant(
            ("dynamodb:GetItem", "dynamodb:PutItem", "dynamodb:UpdateItem", "dynamodb:Query"),
            ("{ledger}",),
            "a batch's trust item, read and written over the revision read; a release re-offers the released "
            "pairs (rewrites their pair items) and touches the batch so the trigger looks at it again; the "
            "batch report is rebuilt from the batch's records",
            ("ForAllValues:StringLike:dynamodb:LeadingKeys=batch#*,trust#*",),
        ),
        Grant(
            ("dynamodb:GetItem",),
            ("{ledger}",),
            "which run holds the lock: it keeps the dataset version it froze (read only)",
            ("ForAllValues:StringEquals:dynamodb:LeadingKeys={lock}",),
        ),
        Grant(
            ("dynamodb:Query",),
            ("{ledger}/index/state",),
            "every batch, and every batch with pair verdicts (`retrain data held`)",
        ),
        Grant(
            ("dynamodb:DescribeTable",),
            ("{ledger}",),
            "`--ledger-table` is checked before anything is decided",
        ),
        Grant(("s3:ListBucket",), ("{bucket}",), "HeadBucket: `--bucket` is checked before anything is decided"),
        Grant(
            ("s3:PutObject",),
            ("{bucket}/reports/batches/*",),
            "the batch's report, rewritten after a decision: its team reads what is held and why",
        ),
        S3_WRITE_KEY,
        Grant(
            ("cloudformation:DescribeStacks",),
            ("arn:{partition}:cloudformation:{region}:{account}:stack/{stack_name}/*",),
            "`--stack` finds the bucket and the ledger in the stack's outputs",
        ),
    ),
}


DENIALS: dict[str, tuple[Grant, ...]] = {
    "IntakeFunction": (
        Grant(
            ("s3:PutObject",),
            ("{bucket}/reports/runs/*",),
            "it decodes untrusted images with Pillow: taken over, it still cannot write a run's evidence",
        ),
        Grant(
            ("dynamodb:*",),
            ("{ledger}",),
            "the same: it cannot take, hold or free the run lock, whatever an Allow says",
            ("ForAnyValue:StringEquals:dynamodb:LeadingKeys={lock}",),
        ),
        Grant(
            TRUST_WRITES,
            ("{ledger}",),
            "the same: trust is earned by an independent judgement or given by a named person, never by an "
            "upload; it may read a batch's trust item for its report, never write one, whatever an Allow says",
            ("ForAnyValue:StringLike:dynamodb:LeadingKeys=trust#*",),
        ),
    ),
}
