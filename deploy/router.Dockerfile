# The image of `qwen3lab router` for the split topology's compose and Kubernetes exports:
#   docker build -t qwen3lab -f deploy/router.Dockerfile .
# It needs no GPU and no vLLM: the router counts prompt tokens with the `tokenizers` library.
FROM python:3.12-slim
COPY . /src
RUN pip install --no-cache-dir /src && rm -rf /src
EXPOSE 9000
CMD ["qwen3lab", "router", "--help"]
