# The two set-up commands of the README:
#   make demo   the whole job end to end on the built-in CPU default
#   make test   every test (what CI runs)
.PHONY: demo test venv
PY := .venv/bin/python

venv:
	@scripts/setup-venv.sh

demo: venv
	.venv/bin/tpcomm demo --out runs/demo

test: venv
	$(PY) -m pytest -q -rs
