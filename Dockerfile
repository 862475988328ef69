FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md alembic.ini ./
COPY migrations migrations
COPY optimizer optimizer
COPY runtime runtime
COPY service service
# Editable: settings find migrations/ and var/ relative to the source tree.
RUN pip install --no-cache-dir -e '.[mkl]' && mkdir -p var
ENV FUSIONWATCH_DATABASE_URL=sqlite:////app/var/fusionwatch.db
EXPOSE 8000
CMD ["sh", "-c", "fusionwatch db upgrade && fusionwatch serve --host 0.0.0.0 --port 8000"]
