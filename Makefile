# Every target that runs code first brings .venv up to date from the pinned constraints.
PY        ?= python3.11
VENV      := .venv
VPY       := $(VENV)/bin/python
STAMP     := $(VENV)/.installed
PYTEST_ARGS ?=
# make demo DEMO_ARGS="--keep-running" (or --report FILE, --headless)
DEMO_ARGS ?=
# test files run in parallel on pytest-xdist workers, each file on one worker (its module-scoped
# servers start once), longest first (tests/conftest.py); TEST_WORKERS=0 runs them in this process.
# Three on two cores: the tests wait on processes more than they compute (with two workers the
# cores were busy half the time; 17.5 -> 13 min, every test passing)
TEST_WORKERS ?= 3

.PHONY: venv demo test bench clean

venv: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	@test -x $(VPY) || $(PY) -m venv $(VENV)
	$(VPY) -m pip install -q --upgrade "pip>=24"
	$(VPY) -m pip install -q -c constraints.txt -e ".[test]"
	@touch $(STAMP)

demo: venv
	$(VPY) -m airflow_gpu demo $(DEMO_ARGS)

test: venv
	@test -x /usr/bin/chromium || (apt-get update && apt-get install -y chromium)  # UI browser test
	$(VPY) -m pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=25 $(PYTEST_ARGS)

bench: venv
	$(VPY) -m bench

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
