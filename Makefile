# OrchWeave: the two commands of the README, each creating .venv with Python 3.12 when missing.
#   make pretrain   the main job: a small three-modality pretrain on CPU, 2 gloo ranks
#   make test       the test suite (scripts/run_tests.sh: single-process tests 2 at a time,
#                   then the multi-process ones; PYTEST_ARGS go to both passes)
#   make demo-data  a small real Energon dataset (images, audio, captions, a tokenizer) in
#                   demo-data/, for `make pretrain ARGS="--data-path demo-data ..."`
#   make gpu-check ARGS=OUT_DIR    the prepared GPU check (tools/gpu/check.sh; ARGS="--dry-run
#                                  OUT_DIR" on CPU); on the GPU machine it needs no .venv
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.orchweave-installed

.PHONY: venv pretrain test demo-data gpu-check clean-venv

venv: $(STAMP)

$(STAMP): setup.py pyproject.toml
	test -x $(PY) || "$$(scripts/find_python312.sh)" -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

pretrain: $(STAMP)
	scripts/pretrain_mllm_cpu.sh $(ARGS)

test: $(STAMP)
	PYTHON=$(PY) scripts/run_tests.sh $(PYTEST_ARGS)

demo-data: $(STAMP)
	$(PY) tools/make_demo_data.py demo-data $(ARGS)

# No $(STAMP): the GPU machine has no network to build .venv; check.sh installs .whl/ itself.
gpu-check:
	tools/gpu/check.sh $(if $(ARGS),$(ARGS),gpu-check-out)

clean-venv:
	rm -rf $(VENV)
