FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md alembic.ini ./
COPY migrations migrations
COPY optimizer optimizer
COPY runtime runtime
COPY service service
# Editable: settings find migrations/ and var/ relative to the source tree.
# libgomp1: the OpenMP runtime the onednn extra's libdnnl links against.
RUN apt-get update && apt-get install -y --no-install-recommends libgomp1 && rm -rf /var/lib/apt/lists/*
RUN pip install --no-cache-dir -e '.[mkl,onednn]' && mkdir -p var
ENV FUSIONWATCH_DATABASE_URL=sqlite:////app/var/fusionwatch.db
EXPOSE 8000
CMD ["sh", "-c", "fusionwatch db upgrade && fusionwatch serve --host 0.0.0.0 --port 8000"]
