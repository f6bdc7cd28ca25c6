"""FSx for Lustre, emulated (`emulator.py`): the template's file system and data-repository
association, and import tasks that copy the curated zone into a local folder playing the mount."""
