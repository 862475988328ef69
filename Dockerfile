FROM python:3.11-slim
WORKDIR /app
# libgomp1: the OpenMP runtime the onednn extra's libdnnl links against.
RUN apt-get update && apt-get install -y --no-install-recommends libgomp1 && rm -rf /var/lib/apt/lists/*
COPY pyproject.toml README.md alembic.ini ./
COPY migrations migrations
COPY optimizer optimizer
COPY runtime runtime
COPY service service
# Editable: settings find migrations/ and var/ relative to the source tree.
RUN pip install --no-cache-dir -e '.[mkl,onednn]'
# Not root: a Celery worker refuses to be one without a warning, and neither needs to be.
# /data is docker-compose.yml's models volume (FUSIONWATCH_DATA_DIR); var/ the single-container default.
RUN useradd --create-home --uid 1000 fusionwatch && mkdir -p var /data && chown fusionwatch var /data
USER fusionwatch
ENV FUSIONWATCH_DATABASE_URL=sqlite:////app/var/fusionwatch.db
EXPOSE 8000
CMD ["sh", "-c", "fusionwatch db upgrade && exec fusionwatch serve --host 0.0.0.0 --port 8000"]
