# The example trainer of deploy/compose.yaml (deploy/trainer_example.py): the flightfeed client with
# the CPU build of torch. Build from the repository root:
#   docker build -f deploy/trainer.Dockerfile -t flightfeed-trainer:latest .
#
# It is a CPU demo: torch comes as its CPU wheel (0.75 GB installed; PyPI's default CUDA build
# made this image 5.36 GB). A GPU trainer brings its own CUDA image (e.g. a pytorch/pytorch or NGC
# image) and adds the client to it: pip install "flightfeed[client]".
#
# PYTHON_IMAGE: the base image (as in deploy/Dockerfile).
# TORCH_INDEX_URL: where the CPU wheel comes from (default the official PyTorch CPU index). Empty:
#   pip's own configuration provides it (a mirror, a wheelhouse in find-links); the pin
#   "torch==VERSION+cpu" makes sure it is the CPU build either way, and fails clearly if not found.
ARG PYTHON_IMAGE=python:3.11-slim

FROM ${PYTHON_IMAGE} AS build
WORKDIR /src
RUN python -m pip install --no-cache-dir --upgrade pip build
COPY pyproject.toml README.md ./
COPY server server
COPY client client
COPY proto_schemas proto_schemas
RUN python -m build --wheel --outdir /wheels .

FROM ${PYTHON_IMAGE} AS trainer
ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
RUN python -m pip install --no-cache-dir ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"} "torch==${TORCH_VERSION}+cpu"
COPY --from=build /wheels /wheels
RUN python -m pip install --no-cache-dir "$(ls /wheels/flightfeed-*.whl)[client]" \
    && python -c "import torch; assert not torch.version.cuda, 'a CUDA build of torch: expected the CPU wheel'" \
    && rm -rf /wheels \
    && useradd --system --uid 10001 --user-group --create-home --home-dir /home/flightfeed flightfeed
COPY deploy/trainer_example.py /home/flightfeed/trainer_example.py
USER 10001:10001
WORKDIR /home/flightfeed
ENTRYPOINT ["python", "/home/flightfeed/trainer_example.py"]
