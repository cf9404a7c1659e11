# condtok_mm: `make demo` and `make test` do all set-up on a fresh machine (see README.md).
PYTHON ?= python3.11
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.condtok_mm-install

DEMO_CONFIG ?= configs/demo/mask-rcnn_swin-mini-condtok_fpn_12e_shapes.py
DEMO_WORK_DIR ?= work_dirs/demo
DEMO_DATA ?= data/shapes/

.PHONY: install demo test test-quick clean-demo

# The install script is idempotent (a stamp plus a check that mmcv.ops loads); a second run takes seconds.
install:
	PYTHON=$(PYTHON) VENV=$(VENV) bash tools/install.sh

demo: install
	$(PY) tools/dataset/make_shapes.py --out-dir $(DEMO_DATA)
	$(PY) tools/train.py $(DEMO_CONFIG) --work-dir $(DEMO_WORK_DIR)
	$(PY) tools/test.py $(DEMO_CONFIG) $$(cat $(DEMO_WORK_DIR)/last_checkpoint) \
		--work-dir $(DEMO_WORK_DIR)/test --show-dir predictions
	$(PY) tools/analysis/summarize_test.py $(DEMO_WORK_DIR)/test

test: install
	$(PY) -m pytest tests

test-quick: install
	$(PY) -m pytest -m "not slow" tests

clean-demo:
	rm -rf $(DEMO_WORK_DIR)
