# Everyday targets. `make demo` and `make test` are the README's two commands.
.PHONY: setup demo test test-all check test-fast lint format bench bench-quick gpu-check clean

VENV := . .venv/bin/activate &&

setup:
	./scripts/setup.sh

demo: setup
	$(VENV) zoi demo

# CI's tier (<= 20 minutes on 2 cores, setup included): every test but the slow tier's, the
# slowest 25 named; then the C++ core once more under ASan + UBSan (~2-3 min)
test: setup
	$(VENV) ruff check src tests lab scripts && ruff format --check src tests lab scripts   # lint first (seconds)
	$(VENV) python -m pytest -q -n 2 --dist loadfile --timeout 1200 -m "not slow" --durations=25
	./scripts/sanitize.sh

# everything: the default tier plus the slow one (clusters, second environments, full sweeps,
# the benchmark harness end to end, the long soak)
test-all: setup
	$(VENV) ruff check src tests lab scripts && ruff format --check src tests lab scripts
	$(VENV) python -m pytest -q -n 2 --dist loadfile --timeout 1800 --durations=25
	./scripts/sanitize.sh

# the edit loop (~2 minutes on 2 cores): the units, each op and kernel on the ISA the core picks
# and on scalar (ZOI_TEST_ISAS=quick; CI's tier forces every ISA the CPU runs), the planner, the
# quantiser and the tokenizers on small inputs, generation on the CPU; not the real-model
# accuracy runs, the exhaustive tokenizer sweeps, the server, the heads, the architectures or the
# GPU backend's interpreter tests (all in `make test`). Stops at the first failure.
CHECK_TESTS := tests/ops tests/cpu tests/quant tests/tokenizer tests/test_ir.py tests/test_planner.py \
	tests/test_layers.py tests/test_quantmode.py tests/test_engine.py tests/decoder/test_cpu_backend.py \
	tests/decoder/test_scheduler.py tests/decoder/test_reference.py
CHECK_SKIP := --ignore=tests/quant/test_minilm_int8.py --ignore=tests/tokenizer/test_codepoints.py \
	--ignore=tests/cpu/test_real_minilm_cpu.py
check:
	$(VENV) ZOI_TEST_ISAS=quick python -m pytest -q -x -n 2 --dist loadfile -m "not slow" --durations=10 \
		$(CHECK_SKIP) $(CHECK_TESTS)

test-fast: check

lint:
	$(VENV) ruff check src tests lab scripts && ruff format --check src tests lab scripts

format:
	$(VENV) ruff format src tests lab scripts && ruff check --fix src tests lab scripts

bench: setup
	$(VENV) pip install -q -e ".[bench]" --no-build-isolation && zoi bench

bench-quick: setup
	$(VENV) pip install -q -e ".[bench]" --no-build-isolation && zoi bench --quick

# Run on a machine with an NVIDIA GPU (the lent H200): install, test, benchmark.
gpu-check:
	./scripts/gpu_check.sh

clean:
	rm -rf build dist .pytest_cache .ruff_cache

.PHONY: docs wheel

# the documentation site in build/site; --strict fails on any broken link, anchor or page missing from the nav
docs: setup
	$(VENV) mkdocs build --strict

# an sdist and a wheel in dist/ (python -m build: the wheel is built from the sdist, in a temporary
# tree, never in ./build), then auditwheel's manylinux copy of the wheel beside it (docs/INSTALL.md)
wheel: setup
	rm -rf dist
	$(VENV) python -m build --no-isolation --outdir dist .
	$(VENV) auditwheel repair --wheel-dir dist dist/zoi-*-linux_x86_64.whl
