"""What flows between the services and out to people: EventBridge's default bus delivering AWS
services' events to the functions whose rules match (`eventbridge.py`), S3 notifications with the
`versionId` and `sequencer` AWS adds (`s3_events.py`), and what the team receives, a Slack webhook
on loopback and the SNS topic's inbox (`notifications.py`)."""
