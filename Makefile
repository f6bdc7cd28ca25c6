# One entry point for everything: `make run` and `make test` set up what they need themselves.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
TOOLS := .tools
# Tools that are not the project's dependencies, each in its own environment under .tools/
# (aws-sam-cli pins an older boto3 than ours; checkov pins much of its own; the SageMaker SDK v2
# pins attrs, packaging, protobuf, rich and more). A stamp named after the pinned version marks an
# install: changing a pin reinstalls that tool, nothing else does.
ASL_VALIDATOR_VERSION := 4.0.0
SAM_CLI_VERSION := 1.170.0
CHECKOV_VERSION := 3.3.30
SAGEMAKER_SDK_VERSION := 2.257.7
ASL_VALIDATOR := $(TOOLS)/node_modules/.bin/asl-validator
SAM := $(TOOLS)/sam/bin/sam
CHECKOV := $(TOOLS)/checkov/bin/checkov
SAGEMAKER_SDK := $(TOOLS)/sagemaker-sdk
ASL_VALIDATOR_STAMP := $(TOOLS)/.asl-validator-$(ASL_VALIDATOR_VERSION)
SAM_STAMP := $(TOOLS)/sam/.installed-$(SAM_CLI_VERSION)
CHECKOV_STAMP := $(TOOLS)/checkov/.installed-$(CHECKOV_VERSION)
SAGEMAKER_SDK_STAMP := $(SAGEMAKER_SDK)/.installed-$(SAGEMAKER_SDK_VERSION)
# The tests that compare our CreateTrainingJob request and image tables with the SDK's own.
SDK_PARITY_TESTS := tests/unit/training_job/test_sdk_parity.py tests/unit/training_job/test_images.py
# The default training image's torch and Python (functions/training_job/images.py; a unit test
# keeps them equal): the trainer's tests run under it, in .tools/torch-<version>. PyPI has only
# CUDA builds of torch for Linux x86_64, so that environment is about 6.4 GB; pip's cache keeps
# the wheels, so rebuilding it on the same machine (a pin changed) downloads nothing again.
IMAGE_TORCH_VERSION := 2.8.0
IMAGE_PYTHON_VERSION := 3.12
IMAGE_TORCH := $(TOOLS)/torch-$(IMAGE_TORCH_VERSION)
IMAGE_TORCH_STAMP := $(IMAGE_TORCH)/.installed
# The trainer's tests, and the check that every module imports without the dev tools.
IMAGE_TORCH_TESTS := tests/trainer tests/unit/test_declared_dependencies.py
# The Lambda runtime's Python (template.yaml's Globals: a unit test keeps them equal). The
# functions' tests run under it too, in .tools/lambda-python-<version>: the project with the
# offline stack and the test tools, no torch. Out of them, the tests that need torch: those that
# read the trainer's code, train (an emulated job, `retrain train`, the demo) or import every
# module; the other runs cover them. A new test that needs torch fails here, by name, until
# listed.
LAMBDA_PYTHON_VERSION := 3.13
LAMBDA_ENV := $(TOOLS)/lambda-python-$(LAMBDA_PYTHON_VERSION)
LAMBDA_ENV_STAMP := $(LAMBDA_ENV)/.installed
LAMBDA_TESTS := tests/unit tests/integration/lambda_handlers \
  --ignore=tests/unit/test_rule_words.py --ignore=tests/unit/test_rule_defaults_agree.py \
  --ignore=tests/unit/training_job/test_builder.py --ignore=tests/unit/test_declared_dependencies.py \
  --ignore=tests/unit/test_local_demo_command.py --ignore=tests/integration/lambda_handlers/test_evaluate_run_handler.py \
  --deselect=tests/unit/test_cli_checks_first.py::test_train_on_a_file_that_is_no_manifest_leaves_out_alone \
  --deselect=tests/unit/test_cli_checks_first.py::test_train_on_a_manifest_whose_image_is_missing_leaves_out_alone \
  --deselect=tests/unit/test_cli_checks_first.py::test_train_refuses_a_flag_before_it_deletes_the_last_checkpoints

# Every environment installs the project editable, which writes retrain.egg-info in this folder:
# under `make -j` those installs take turns (the downloads around them need not).
EDITABLE_INSTALL := mkdir -p $(TOOLS) && flock $(TOOLS)/.editable-install.lock

.DEFAULT_GOAL := help
.PHONY: help venv tools run test test-envs test-quick test-sdk-parity test-trainer-image-torch test-lambda-python lint format typecheck pr bench bench-screening stress-teardown statemachine validate-template sam-build package-trainer upload-trainer deploy lock clean

help: ## Show the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-25s %s\n", $$1, $$2}'

# The environment is rebuilt only when the dependency declarations change (fast when present).
$(STAMP): pyproject.toml constraints.txt
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(EDITABLE_INSTALL) $(BIN)/python -m pip install --quiet -c constraints.txt -e '.[dev]'
	@touch $(STAMP)

venv: $(STAMP) ## Create or update the virtual environment

run: $(STAMP) ## Run the whole loop offline (moto + real functions + state machine)
	$(BIN)/retrain local demo

# `make test` runs every test CI runs, each once, on TEST_WORKERS pytest-xdist workers (one per
# core: the suite keeps both cores busy, and 3 workers measured no faster; benchmarks/README.md):
#   1. everything but the trainer's tests (and the import check that runs with them), fast and
#      slow in one run, under .venv (Python 3.11, the development torch), with the slowest tests
#      listed at the end (--durations);
#   2. the trainer's tests under the default training image's torch and Python (what SageMaker
#      runs), in .tools/torch-<version>;
#   3. the functions' tests under the Lambda runtime's Python (template.yaml's Runtime);
#   4. our training-job requests against the SageMaker SDK's, in its own environment.
# `make test-quick` is the edit-test loop: the tests not marked slow, all under .venv.
TEST_WORKERS ?= 2
# worksteal: a worker that runs out takes queued tests from the other (a few scenarios take minutes)
XDIST := -n $(TEST_WORKERS) --dist worksteal
DURATIONS := --durations=20 --durations-min=5
test: $(STAMP) tools $(IMAGE_TORCH_STAMP) $(LAMBDA_ENV_STAMP) ## Every test CI runs, each once (about 22 minutes on 2 cores, after the set-up)
	$(BIN)/pytest $(XDIST) $(DURATIONS) --ignore=tests/trainer --ignore=tests/unit/test_declared_dependencies.py
	$(MAKE) --no-print-directory test-trainer-image-torch test-lambda-python test-sdk-parity

test-envs: $(STAMP) tools $(IMAGE_TORCH_STAMP) $(LAMBDA_ENV_STAMP) ## Create every environment make test uses, run nothing

test-quick: $(STAMP) ## The tests not marked slow, under .venv alone: the edit-test loop
	$(BIN)/pytest $(XDIST) -m "not slow"

# The parity tests import the SDK, so they run in its environment (the project's dependencies
# resolved beside it, with pytest); in .venv they skip, naming this target.
test-sdk-parity: $(SAGEMAKER_SDK_STAMP) ## Our training-job request and image tables against the SageMaker SDK v2's
	$(SAGEMAKER_SDK)/bin/pytest -p no:cacheprovider $(SDK_PARITY_TESTS)

# The trainer runs in AWS's image, on an older torch and another Python than .venv's: its tests
# run there (and only there, in `make test`). Only the runtime and test extras (no dev tools),
# other pins from constraints.txt.
test-trainer-image-torch: $(IMAGE_TORCH_STAMP) ## The trainer's tests under the default training image's torch and Python
	$(IMAGE_TORCH)/bin/pytest -p no:cacheprovider $(XDIST) $(DURATIONS) $(IMAGE_TORCH_TESTS)

# The functions run on Lambda's Python, newer than .venv's: their tests run there too, so code
# that only 3.11 accepts (or a pin without a wheel for it) fails here, not on Lambda.
test-lambda-python: $(LAMBDA_ENV_STAMP) ## The functions' tests under the Lambda runtime's Python (3.13)
	@if [ -f $(LAMBDA_ENV)/.missing ]; then cat $(LAMBDA_ENV)/.missing; \
	  test -z "$$CI" || { echo "CI must run them: install Python $(LAMBDA_PYTHON_VERSION)"; exit 2; }; \
	else $(LAMBDA_ENV)/bin/pytest -p no:cacheprovider $(XDIST) $(LAMBDA_TESTS); fi

lint: $(STAMP) ## ruff lint and format check
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: $(STAMP) ## Apply ruff's formatting and safe fixes
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

# tests/permissions.py too: no package ships it, but the template is checked against its grants.
typecheck: $(STAMP) ## mypy (strict) on the code that ships, and the declared permissions
	$(BIN)/mypy functions retrain trainer tests/permissions.py

pr: lint typecheck validate-template sam-build test ## Everything CI runs, before you open a pull request

bench: $(STAMP) ## Run the ratio benchmarks (prints name: value lines)
	@for bench in benchmarks/bench_*.py; do echo "# $$bench"; $(BIN)/python $$bench || exit 1; done

# The screen's precision and recall per kind of label error (trains its fixed model once, ~6 min).
bench-screening: $(STAMP) ## How well the screen sees: synthetic label errors, held share, precision and recall
	$(BIN)/python benchmarks/bench_screening_quality.py

stress-teardown: $(STAMP) ## 100 two-process trainings and 100 SIGTERM-then-resume pairs: none may abort at exit
	$(BIN)/python benchmarks/stress_teardown.py

$(ASL_VALIDATOR_STAMP):
	npm install --silent --no-audit --no-fund --prefix $(TOOLS) asl-validator@$(ASL_VALIDATOR_VERSION)
	@rm -f $(TOOLS)/.asl-validator-* && touch $@

$(SAM_STAMP):
	rm -rf $(TOOLS)/sam
	$(PYTHON) -m venv $(TOOLS)/sam
	$(TOOLS)/sam/bin/python -m pip install --quiet --upgrade pip
	$(TOOLS)/sam/bin/python -m pip install --quiet aws-sam-cli==$(SAM_CLI_VERSION)
	@touch $@

$(CHECKOV_STAMP):
	rm -rf $(TOOLS)/checkov
	$(PYTHON) -m venv $(TOOLS)/checkov
	$(TOOLS)/checkov/bin/python -m pip install --quiet --upgrade pip
	$(TOOLS)/checkov/bin/python -m pip install --quiet checkov==$(CHECKOV_VERSION)
	@touch $@

# Beside the SDK: the project (for its own dependencies; the tests import it from the work tree)
# and pytest. Updated in place when pyproject.toml or the pin changes.
$(SAGEMAKER_SDK_STAMP): pyproject.toml
	@test -x $(SAGEMAKER_SDK)/bin/python || $(PYTHON) -m venv $(SAGEMAKER_SDK)
	$(SAGEMAKER_SDK)/bin/python -m pip install --quiet --upgrade pip
	$(EDITABLE_INSTALL) $(SAGEMAKER_SDK)/bin/python -m pip install --quiet sagemaker==$(SAGEMAKER_SDK_VERSION) -e . pytest pytest-timeout
	@rm -f $(SAGEMAKER_SDK)/.installed-* && touch $@

# The image's Python: on PATH, else pyenv's (whose shim answers only for the selected version),
# else $(PYTHON), said so (torch has wheels for both; the torch version is what matters most).
IMAGE_PYTHON ?= $(or $(shell python$(IMAGE_PYTHON_VERSION) -c 'import sys; print(sys.executable)' 2>/dev/null),$(shell \
  PYENV_VERSION=$$(pyenv latest $(IMAGE_PYTHON_VERSION) 2>/dev/null) python$(IMAGE_PYTHON_VERSION) -c 'import sys; print(sys.executable)' 2>/dev/null),$(PYTHON))
$(IMAGE_TORCH_STAMP): pyproject.toml constraints.txt
	@test -x $(IMAGE_TORCH)/bin/python || $(IMAGE_PYTHON) -m venv $(IMAGE_TORCH)
	@$(IMAGE_TORCH)/bin/python -c 'import sys; v = "%d.%d" % sys.version_info[:2]; v == "$(IMAGE_PYTHON_VERSION)" or print(f"note: no Python $(IMAGE_PYTHON_VERSION) here (the image has it): trainer tests under {v}")'
	$(IMAGE_TORCH)/bin/python -m pip install --quiet --upgrade pip
	grep -v '^torch==' constraints.txt > $(IMAGE_TORCH)/constraints.txt
	@# torch first (the 6.4 GB download), then the project, taking its turn.
	$(IMAGE_TORCH)/bin/python -m pip install --quiet -c $(IMAGE_TORCH)/constraints.txt torch==$(IMAGE_TORCH_VERSION)
	$(EDITABLE_INSTALL) $(IMAGE_TORCH)/bin/python -m pip install --quiet -c $(IMAGE_TORCH)/constraints.txt \
	  torch==$(IMAGE_TORCH_VERSION) -e '.[local,trainer,test]'
	@touch $@

# Python $(LAMBDA_PYTHON_VERSION) on PATH or pyenv's; without it the environment records why, and
# `make test-lambda-python` says so (an error under CI).
LAMBDA_PYTHON ?= $(or $(shell python$(LAMBDA_PYTHON_VERSION) -c 'import sys; print(sys.executable)' 2>/dev/null),$(shell \
  PYENV_VERSION=$$(pyenv latest $(LAMBDA_PYTHON_VERSION) 2>/dev/null) python$(LAMBDA_PYTHON_VERSION) -c 'import sys; print(sys.executable)' 2>/dev/null))
$(LAMBDA_ENV_STAMP): pyproject.toml constraints.txt
	@mkdir -p $(LAMBDA_ENV) && rm -f $(LAMBDA_ENV)/.missing
	@if [ -z "$(LAMBDA_PYTHON)" ]; then \
	  echo "note: no Python $(LAMBDA_PYTHON_VERSION) here (pyenv install $(LAMBDA_PYTHON_VERSION), or your distribution's python$(LAMBDA_PYTHON_VERSION), then rm -r $(LAMBDA_ENV)): the functions' tests ran under .venv's Python only" > $(LAMBDA_ENV)/.missing; \
	else \
	  test -x $(LAMBDA_ENV)/bin/python || $(LAMBDA_PYTHON) -m venv $(LAMBDA_ENV); \
	  $(LAMBDA_ENV)/bin/python -m pip install --quiet --upgrade pip && \
	  grep -v '^torch==' constraints.txt > $(LAMBDA_ENV)/constraints.txt && \
	  $(EDITABLE_INSTALL) $(LAMBDA_ENV)/bin/python -m pip install --quiet -c $(LAMBDA_ENV)/constraints.txt -e '.[local,test]' || exit 1; \
	fi
	@touch $@

tools: $(ASL_VALIDATOR_STAMP) $(SAM_STAMP) $(CHECKOV_STAMP) $(SAGEMAKER_SDK_STAMP) ## Install sam, checkov, asl-validator and the SageMaker SDK under .tools/

# The state machine is written in statemachine/retrain.asl.yaml (anchors: one Retry, one Catch);
# SAM and every check read the JSON rendered from it, which a unit test keeps exactly in step.
statemachine: $(STAMP) ## Render statemachine/retrain.asl.yaml (edit that one) as retrain.asl.json (what SAM deploys)
	$(BIN)/python -m retrain.statemachine

# Each check in its own environment: cfn-lint from .venv (constraints.txt pins it), sam and
# checkov from theirs under .tools/, asl-validator from npm. TEMPLATE and ASL name other files
# (the tests point them at broken copies). checkov reads the SAM template as it is (it knows
# AWS::Serverless::Function); --skip-download: no network here, nothing fetched from Prisma Cloud.
# A finding that does not apply is skipped next to its resource in template.yaml, with the reason.
TEMPLATE ?= template.yaml
ASL ?= statemachine/retrain.asl.json
validate-template: $(STAMP) $(ASL_VALIDATOR_STAMP) $(SAM_STAMP) $(CHECKOV_STAMP) ## cfn-lint, sam validate --lint, asl-validator, checkov
	$(BIN)/cfn-lint $(TEMPLATE)
	SAM_CLI_TELEMETRY=0 $(SAM) validate --lint --region us-east-1 --template-file $(TEMPLATE)
	$(ASL_VALIDATOR) --json-path $(ASL)
	$(CHECKOV) --file $(TEMPLATE) --framework cloudformation --skip-download --compact --quiet

package-trainer: $(STAMP) ## Build build/trainer/sourcedir.tar.gz (reproducible; its sha256 beside it)
	$(BIN)/retrain package-trainer build/trainer

# REGION: the stack's region, when it is not your AWS configuration's (make deploy passes samconfig.toml's).
upload-trainer: package-trainer ## Release the trainer to a deployed stack (as its TrainerReleaseRole): make upload-trainer STACK=name [REGION=r]
	@test -n "$(STACK)" || { echo "usage: make upload-trainer STACK=<stack name> [REGION=<its region>]"; exit 2; }
	$(BIN)/retrain package-trainer build/trainer --stack "$(STACK)" $(if $(REGION),--region "$(REGION)")

# --build-in-source: sam otherwise copies the whole CodeUri (the repository, .venv and .tools
# included: gigabytes) into a scratch folder for each function before it runs make there.
# No container: build-% downloads the functions' platform wheels itself, so no Docker is needed.
sam-build: $(STAMP) $(SAM_STAMP) ## Build the Lambda packages (python3.13, arm64) into .aws-sam/build, print their sizes
	SAM_CLI_TELEMETRY=0 $(SAM) build --build-in-source
	@for dir in .aws-sam/build/*Function; do printf '  %-28s %s MiB\n' "$$(basename $$dir)" "$$(du -sm --apparent-size $$dir | cut -f1)"; done

# A setting of samconfig.toml's default environment, the deploy command's over the global ones
# (as sam reads them); empty when unset. make deploy reads the stack, region and profile from it.
SAMCONFIG := samconfig.toml
SAMCONFIG_GET = $(BIN)/python -c 'import sys, tomllib; config = tomllib.load(open("$(SAMCONFIG)", "rb")).get("default", {}); \
  print(next((section["parameters"][sys.argv[1]] for section in (config.get("deploy", {}), config.get("global", {})) \
  if sys.argv[1] in section.get("parameters", {})), ""))'
# Credentials first (botocore's own search: environment, profile, SSO, instance role; samconfig.toml's
# profile when it names one), before anything is built. With samconfig.toml (copied from
# samconfig.toml.example), sam deploy asks nothing but the change set's confirmation; without one,
# the guided deploy asks and saves the answers there. --no-fail-on-empty-changeset: a deploy that
# changes nothing (only trainer/ changed) still releases the trainer. Every deploy ends with the
# release (what make upload-trainer runs; idempotent, "already there"): without it runs fail.
# Every role is named <stack>-<name> (IAM allows 64 characters), the longest suffix being
# -trainer-release: a longer stack name would fail the deployment half-way (tests/unit/test_role_names.py).
MAX_STACK_NAME := 48
deploy: $(STAMP) ## Build, sam deploy (samconfig.toml, else --guided), then release the trainer (as make upload-trainer)
	@stack=$$(test ! -f $(SAMCONFIG) || $(SAMCONFIG_GET) stack_name 2>/dev/null); \
	test $${#stack} -le $(MAX_STACK_NAME) || \
	  { echo "make deploy: stack name $$stack has $${#stack} characters; at most $(MAX_STACK_NAME) leave room for its role names (<stack>-trainer-release): nothing built or deployed"; exit 2; }
	@profile=$$(test ! -f $(SAMCONFIG) || $(SAMCONFIG_GET) profile 2>/dev/null) || \
	  { echo "make deploy: cannot read $(SAMCONFIG): $$($(SAMCONFIG_GET) profile 2>&1 | tail -1): nothing built or deployed"; exit 2; }; \
	$(BIN)/python -c 'import boto3, sys; sys.exit(boto3.Session(profile_name=sys.argv[1] or None).get_credentials() is None)' "$$profile" 2>/dev/null || \
	  { echo "make deploy: no AWS credentials$${profile:+ for profile $$profile} (aws configure, AWS_PROFILE, or profile in $(SAMCONFIG)): nothing built or deployed"; exit 2; }
	@$(MAKE) --no-print-directory --silent $(SAM_STAMP) || { echo "make deploy: no sam: installing aws-sam-cli $(SAM_CLI_VERSION) under $(TOOLS)/sam failed (above)"; exit 2; }
	@$(MAKE) --no-print-directory sam-build
	@if [ -f $(SAMCONFIG) ]; then \
	  echo "make deploy: sam deploy with $(SAMCONFIG) (its [default] environment)"; \
	  SAM_CLI_TELEMETRY=0 $(SAM) deploy --no-fail-on-empty-changeset; \
	else \
	  echo "make deploy: no $(SAMCONFIG): sam deploy --guided asks for the stack, region and parameters and saves them there"; \
	  echo "  (to answer them in a file instead: cp samconfig.toml.example $(SAMCONFIG), fill it in, make deploy)"; \
	  SAM_CLI_TELEMETRY=0 $(SAM) deploy --guided --no-fail-on-empty-changeset; \
	fi
	@stack=$$(test ! -f $(SAMCONFIG) || $(SAMCONFIG_GET) stack_name); \
	test -n "$$stack" || { echo "make deploy: deployed, but the trainer is not released (no stack_name in $(SAMCONFIG)): make upload-trainer STACK=<stack> REGION=<region>"; exit 2; }; \
	region=$$($(SAMCONFIG_GET) region); profile=$$($(SAMCONFIG_GET) profile); \
	echo "make deploy: releasing the trainer to stack $$stack$${region:+ in $$region} (make upload-trainer STACK=$$stack$${region:+ REGION=$$region})"; \
	$${profile:+env AWS_PROFILE=$$profile} $(BIN)/retrain package-trainer build/trainer --stack "$$stack" $${region:+--region "$$region"}

lock: ## Re-pin every dependency into constraints.txt after changing pyproject.toml
	$(BIN)/python -m pip freeze --exclude-editable | sed -E 's/\+cpu$$//' > constraints.txt

# SAM's makefile builder for every function (Metadata: BuildMethod: makefile): the functions
# package and the Lambda runtime dependencies only, never torch or the offline stack.
# `sam build` runs `make build-<LogicalId>` with ARTIFACTS_DIR set, in the environment sam was
# started from (PYTHON too, when exported): so the recipe names its interpreter by absolute path,
# the project's .venv (its pip is the one constraints.txt was tested with), not whatever python3
# is first on PATH. Any pip would do: nothing is built, the wheels below are only unpacked.
#
# The wheels are for the functions' platform (template.yaml's Globals: python3.13 on arm64), not
# this machine's: CPython 3.13 binary wheels for manylinux aarch64, so pydantic-core, Pillow and
# wrapt are the aarch64 cp313 builds (Lambda's Amazon Linux 2023 has glibc 2.34, newer than
# either tag needs). --no-compile: bytecode of this machine's Python is no use to 3.13.
ROOT := $(patsubst %/,%,$(dir $(abspath $(lastword $(MAKEFILE_LIST)))))
LAMBDA_PIP := $(ROOT)/$(BIN)/python -m pip install --quiet --disable-pip-version-check --no-compile --upgrade \
  --platform manylinux2014_aarch64 --platform manylinux_2_28_aarch64 \
  --implementation cp --python-version 3.13 --only-binary=:all: -c $(ROOT)/constraints.txt
LAMBDA_REQUIREMENTS := aws-lambda-powertools pydantic pydantic-settings pillow slack-sdk
# Powertools' `tracer` extra is aws-xray-sdk, which requires botocore (about 22 MiB unzipped, a
# third of the package). The Lambda runtime provides boto3 and botocore, which the functions use
# anyway: so aws-xray-sdk and its only other dependency, wrapt, go in without their dependencies.
LAMBDA_REQUIREMENTS_NO_DEPS := aws-xray-sdk wrapt

# Every function has the same dependencies: they are unpacked once, into build/lambda-deps (one pip
# run, not two per function), and each build-% copies them. Unpacked again when a pin or this
# Makefile changes.
LAMBDA_DEPS := $(ROOT)/build/lambda-deps
LAMBDA_DEPS_STAMP := $(ROOT)/build/.lambda-deps-installed
$(LAMBDA_DEPS_STAMP): $(ROOT)/constraints.txt $(ROOT)/Makefile
	@test -x "$(ROOT)/$(BIN)/python" || { echo "lambda deps: run 'make venv' first (pip of $(ROOT)/$(BIN))"; exit 2; }
	rm -rf "$(LAMBDA_DEPS)" && mkdir -p "$(LAMBDA_DEPS)"
	$(LAMBDA_PIP) --target "$(LAMBDA_DEPS)" $(LAMBDA_REQUIREMENTS)
	$(LAMBDA_PIP) --target "$(LAMBDA_DEPS)" --no-deps $(LAMBDA_REQUIREMENTS_NO_DEPS)
	@touch $@

build-%: $(LAMBDA_DEPS_STAMP)
	@test -n "$(ARTIFACTS_DIR)" || { echo "build-$*: ARTIFACTS_DIR is not set (sam build sets it)"; exit 2; }
	mkdir -p "$(ARTIFACTS_DIR)"
	cp -r "$(ROOT)/functions" "$(ARTIFACTS_DIR)/"
	find "$(ARTIFACTS_DIR)/functions" -name __pycache__ -prune -exec rm -rf {} +
	cp -a "$(LAMBDA_DEPS)/." "$(ARTIFACTS_DIR)/"
	@# Without importing (aarch64 wheels): every import of functions/ resolves to the package, the
	@# 3.13 standard library or the runtime's boto3; no boto3/botocore inside. Prints the size.
	$(ROOT)/$(BIN)/python -m retrain.lambda_package "$(ARTIFACTS_DIR)"

clean: ## Remove the environment and caches
	rm -rf $(VENV) $(TOOLS) .pytest_cache .mypy_cache .ruff_cache *.egg-info
