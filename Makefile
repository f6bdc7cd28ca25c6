# One entry point for everything: `make run` and `make test` set up what they need themselves.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
TOOLS := .tools
ASL_VALIDATOR_VERSION := 4.0.0

.DEFAULT_GOAL := help
.PHONY: help venv run test test-fast lint format typecheck pr bench validate-template package-trainer upload-trainer deploy lock clean

help: ## Show the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-18s %s\n", $$1, $$2}'

# The environment is rebuilt only when the dependency declarations change (fast when present).
$(STAMP): pyproject.toml constraints.txt
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[dev]'
	@touch $(STAMP)

venv: $(STAMP) ## Create or update the virtual environment

run: $(STAMP) ## Run the whole loop offline (moto + real functions + state machine)
	$(BIN)/retrain local demo

test: $(STAMP) ## Run every test (set-up included)
	$(BIN)/pytest

test-fast: $(STAMP) ## Run the tests not marked slow
	$(BIN)/pytest -m "not slow"

lint: $(STAMP) ## ruff lint and format check
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: $(STAMP) ## Apply ruff's formatting and safe fixes
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

typecheck: $(STAMP) ## mypy (strict) on the code that ships
	$(BIN)/mypy functions retrain trainer

pr: lint typecheck validate-template test ## Everything CI runs, before you open a pull request

bench: $(STAMP) ## Run the ratio benchmarks (prints name: value lines)
	@for bench in benchmarks/bench_*.py; do echo "# $$bench"; $(BIN)/python $$bench || exit 1; done

$(TOOLS)/node_modules/.bin/asl-validator:
	npm install --silent --no-audit --no-fund --prefix $(TOOLS) asl-validator@$(ASL_VALIDATOR_VERSION)

validate-template: $(STAMP) $(TOOLS)/node_modules/.bin/asl-validator ## cfn-lint the template, validate the ASL graph
	$(BIN)/cfn-lint template.yaml
	$(TOOLS)/node_modules/.bin/asl-validator --json-path statemachine/retrain.asl.json

package-trainer: $(STAMP) ## Build build/trainer/sourcedir.tar.gz (reproducible; its sha256 beside it)
	$(BIN)/retrain package-trainer build/trainer

upload-trainer: package-trainer ## Upload the trainer to a deployed stack: make upload-trainer STACK=name
	@test -n "$(STACK)" || { echo "usage: make upload-trainer STACK=<stack name>"; exit 2; }
	$(BIN)/retrain package-trainer build/trainer --stack "$(STACK)"

deploy: ## Deploy with AWS SAM, then upload the trainer (needs sam and AWS credentials)
	sam build && sam deploy --guided
	@echo "Now: make upload-trainer STACK=<the stack name you chose>"

lock: ## Re-pin every dependency into constraints.txt after changing pyproject.toml
	$(BIN)/python -m pip freeze --exclude-editable | sed -E 's/\+cpu$$//' > constraints.txt

# SAM's makefile builder for every function (Metadata: BuildMethod: makefile): the functions
# package and the Lambda runtime dependencies only, never torch or the offline stack.
build-%:
	mkdir -p "$(ARTIFACTS_DIR)"
	cp -r functions "$(ARTIFACTS_DIR)/"
	$(PYTHON) -m pip install --quiet --target "$(ARTIFACTS_DIR)" \
	  -c constraints.txt 'aws-lambda-powertools[tracer]' pydantic pydantic-settings pillow slack-sdk

clean: ## Remove the environment and caches
	rm -rf $(VENV) $(TOOLS) .pytest_cache .mypy_cache .ruff_cache *.egg-info
