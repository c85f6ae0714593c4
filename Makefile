# Everyday targets. `make demo` and `make test` are the README's two commands.
.PHONY: setup demo test test-fast lint format bench bench-quick gpu-check clean

VENV := . .venv/bin/activate &&

setup:
	./scripts/setup.sh

demo: setup
	$(VENV) zoi demo

test: setup
	$(VENV) ruff check src tests lab scripts && ruff format --check src tests lab scripts   # lint first (seconds)
	$(VENV) python -m pytest -q -n 2 --dist loadfile --timeout 1200
	./scripts/sanitize.sh   # the C++ core's tests once more, built with ASan + UBSan (~2-3 min)

test-fast:
	$(VENV) python -m pytest -q -x -m "not slow"

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
