# The two set-up commands of the README:
#   make demo   the whole job end to end on the built-in CPU default
#   make demo-compare   the same, plus one comparison with a real lever (TP 1 against TP 2)
#   make test   every test (what CI runs)
.PHONY: demo demo-compare test venv
PY := .venv/bin/python

venv:
	@scripts/setup-venv.sh

demo: venv
	.venv/bin/tpcomm demo --out runs/demo

demo-compare: venv
	.venv/bin/tpcomm demo --out runs/demo --compare

test: venv
	scripts/test.sh
