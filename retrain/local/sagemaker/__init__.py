"""SageMaker training jobs, emulated: `training.py` serves the API and says what each file here plays."""
