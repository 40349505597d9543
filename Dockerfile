# ICE ext_proc server image: `docker build -t ice . && docker run -p 50051:50051 ice`
FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
WORKDIR /app
COPY pyproject.toml README.md ./
COPY ext_proc ./ext_proc
RUN pip install --no-cache-dir . && useradd --uid 10001 --no-create-home ice
USER 10001
EXPOSE 50051 9464
ENTRYPOINT ["ice", "serve"]
CMD ["--address", "0.0.0.0:50051", "--metrics-address", "0.0.0.0:9464"]
