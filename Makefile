# OrchWeave: the two commands of the README, each creating .venv with Python 3.12 when missing.
#   make pretrain   the main job: a small three-modality pretrain on CPU, 2 gloo ranks
#   make test       the test suite
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.orchweave-installed

.PHONY: venv pretrain test clean-venv

venv: $(STAMP)

$(STAMP): setup.py pyproject.toml
	test -x $(PY) || "$$(scripts/find_python312.sh)" -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

pretrain: $(STAMP)
	scripts/pretrain_mllm_cpu.sh $(ARGS)

test: $(STAMP)
	$(PY) -m pytest -q $(PYTEST_ARGS)

clean-venv:
	rm -rf $(VENV)
