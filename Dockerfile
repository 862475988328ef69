FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY optimizer optimizer
COPY runtime runtime
COPY service service
RUN pip install --no-cache-dir .
EXPOSE 8000
CMD ["fusionwatch", "serve", "--host", "0.0.0.0", "--port", "8000"]
