"""The CloudFormation subset: `template.yaml` read and resolved (`template.py`), its resources
created in moto and handed to the emulators (`resources.py`), and the offline stack's life cycle
around them (`stack.py`: `OfflineStack`, `StackOptions`)."""
