# Benchwright API / worker image for the production-shaped stack (docker-compose.temporal.yml).
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY benchwright ./benchwright
COPY api ./api
COPY workflows ./workflows
COPY activities ./activities
COPY worker.py ./
RUN pip install --no-cache-dir .
ENV LITELLM_LOCAL_MODEL_COST_MAP=True \
    BENCHWRIGHT_DATA_DIR=/data
EXPOSE 8700
# Idle connections outlast the clients' own keep-alive (benchwright.stack.supervisor.API_KEEP_ALIVE_S).
CMD ["uvicorn", "api.main:create_app", "--factory", "--host", "0.0.0.0", "--port", "8700", "--timeout-keep-alive", "65"]
