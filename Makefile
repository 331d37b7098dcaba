# The two commands of the README: `make demo` and `make test`. Both set up .venv first.
.PHONY: demo test check bootstrap

bootstrap:
	@scripts/bootstrap.sh

# A 90 s soak of the builtin ConvNet (CUDA when present, else CPU), /metrics on 127.0.0.1:9464.
demo: bootstrap
	.venv/bin/soakd run --duration 90s --summary-json soakd-summary.json

test: bootstrap
	.venv/bin/python -m pytest -q

# Lint, format and types over soakd/, tests/ and bench/, as CI runs them.
check: bootstrap
	scripts/check.sh
