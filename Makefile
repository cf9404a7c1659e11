# condtok_mm: `make demo` and `make test` do all set-up on a fresh machine (see README.md).
PYTHON ?= python3.11
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.condtok_mm-install

DEMO_CONFIG ?= configs/demo/mask-rcnn_swin-mini-condtok_fpn_12e_shapes.py
DEMO_BASELINE_CONFIG ?= configs/demo/mask-rcnn_swin-mini_fpn_12e_shapes.py
DEMO_BASELINE_EPOCHS ?= 3
DEMO_WORK_DIR ?= work_dirs/demo
DEMO_DATA ?= data/shapes/
BENCH_DIR ?= work_dirs/benchmark
# Sized so that `make bench` fits 2 CPU cores in an hour; docs/en/benchmarks.md gives the full-size commands.
BENCH_EVAL_IMAGES ?= 1000
GPU_CHECK_DIR ?= work_dirs/gpu_check
NEON_CONFIG ?= configs/neon/faster-rcnn_swin-mini-condtok_fpn_400e_neon-trees.py
NEON_WORK_DIR ?= work_dirs/neon

.PHONY: install demo neon bench study test test-quick gpu-check clean-demo

# The install script is idempotent (a stamp plus a check that mmcv's ops run); a second run takes seconds. Where
# torch sees a GPU and nvcc is there it compiles mmcv's CUDA ops for that GPU (FORCE_CUDA=0: CPU ops only).
install:
	PYTHON=$(PYTHON) VENV=$(VENV) bash tools/install.sh

# Train and evaluate the conditioned demo model, train its baseline twin briefly, compare kappa.
demo: install
	$(PY) tools/dataset/make_shapes.py --out-dir $(DEMO_DATA)
	$(PY) tools/train.py $(DEMO_CONFIG) --work-dir $(DEMO_WORK_DIR)/condtok
	$(PY) tools/test.py $(DEMO_CONFIG) $$(cat $(DEMO_WORK_DIR)/condtok/last_checkpoint) \
		--work-dir $(DEMO_WORK_DIR)/condtok/test --show-dir predictions
	$(PY) tools/train.py $(DEMO_BASELINE_CONFIG) --work-dir $(DEMO_WORK_DIR)/baseline \
		--cfg-options train_cfg.max_epochs=$(DEMO_BASELINE_EPOCHS) train_cfg.val_interval=1000
	$(PY) tools/analysis/plot_conditioning.py $(DEMO_WORK_DIR)/baseline $(DEMO_WORK_DIR)/condtok \
		--labels baseline condtok --out $(DEMO_WORK_DIR)/conditioning.png
	$(PY) tools/analysis/summarize_test.py $(DEMO_WORK_DIR)/condtok/test

# Real photographs: fetch the pinned deepforest wheel (MIT) and tile its NEON tree crowns into data/neon_trees/ (the
# configs' data root), train the conditioned NEON config (400 epochs: about 25 minutes on one idle CPU thread),
# then test it on the held-out image (docs/en/user_guides/neon_trees.md).
neon: install
	$(PY) tools/dataset/make_neon_trees.py --out-dir data/neon_trees/
	$(PY) tools/train.py $(NEON_CONFIG) --work-dir $(NEON_WORK_DIR)
	$(PY) tools/test.py $(NEON_CONFIG) $$(cat $(NEON_WORK_DIR)/last_checkpoint) --work-dir $(NEON_WORK_DIR)/test

# Every benchmark of tools/benchmark/ (tables printed, JSON + PNG under $(BENCH_DIR)); see docs/en/benchmarks.md.
bench: install
	$(PY) tools/dataset/make_shapes.py --out-dir $(DEMO_DATA)
	$(PY) tools/benchmark/overhead.py --out-dir $(BENCH_DIR)/overhead
	$(PY) tools/benchmark/conditioner_cost.py --out-dir $(BENCH_DIR)/conditioner_cost
	$(PY) tools/benchmark/byte_counts.py --out-dir $(BENCH_DIR)/byte_counts
	$(PY) tools/benchmark/hook_overhead.py --size 800 1344 --batch 2 --repeats 3 --out-dir $(BENCH_DIR)/hook_overhead
	$(PY) tools/benchmark/window_conditioning.py --out-dir $(BENCH_DIR)/window_conditioning
	$(PY) tools/benchmark/eval_speed.py --num-images $(BENCH_EVAL_IMAGES) --out-dir $(BENCH_DIR)/eval_speed

# The demo studies (configs/suites/): every variant x learning rate x seed trained and tested, 2 cells at a
# time (about 1.5 hours for each controls suite on 2 CPU cores); tables and plots under $(BENCH_DIR)/<suite>.
study: install
	$(PY) tools/dataset/make_shapes.py --out-dir $(DEMO_DATA)
	$(PY) tools/suites/run_suite.py configs/suites/demo_controls_swin.py --jobs 2 --resume \
		--out-dir $(BENCH_DIR)/demo_controls_swin
	$(PY) tools/suites/run_suite.py configs/suites/demo_controls_vitdet.py --jobs 2 --resume \
		--out-dir $(BENCH_DIR)/demo_controls_vitdet

# Three pytest-xdist workers on 2 cores, each taking whole test files (their module fixtures are built once): the
# end-to-end tests spend much of their time waiting on the processes they start, which another worker fills
# (docs/en/contributing.md has the timings). TEST_WORKERS=0 runs serially.
TEST_WORKERS ?= 3
test: install
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile tests

# One process: its tests are short and in-process (the ones over about a second on 2 cores are marked slow), so a
# second worker would spend more starting up (imports, ~10 s) than it saves.
test-quick: install
	$(PY) -m pytest -m "not slow" tests

# The tests marked gpu and the overhead benchmark on CUDA, numbers in $(GPU_CHECK_DIR)/gpu_check.json; without a
# CUDA device it says so and succeeds.
gpu-check: install
	PYTHON=$(PY) bash tools/gpu_check.sh $(GPU_CHECK_DIR)

clean-demo:
	rm -rf $(DEMO_WORK_DIR)
