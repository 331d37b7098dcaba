# The two commands of the README: `make demo` and `make test`. Both set up .venv first.
.PHONY: demo test check bootstrap servers

bootstrap:
	@scripts/bootstrap.sh

# The third-party inference servers the network-target tests soak, in .venv-servers (no root needed).
servers:
	@scripts/servers-venv.sh

# A 90 s soak of the builtin ConvNet (CUDA when present, else CPU), /metrics on 127.0.0.1:9464.
demo: bootstrap
	.venv/bin/soakd run --duration 90s --summary-json soakd-summary.json

# Unit, integration and end-to-end tiers in turn, each timed (scripts/test.sh). Only what needs
# root is left to skip (Debian's prometheus and chromium), and the closing lines say so.
test: bootstrap servers
	scripts/test.sh

# Lint, format and types over soakd/, tests/ and bench/, as CI runs them.
check: bootstrap
	scripts/check.sh
