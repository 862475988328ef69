from tests.service.db_fixtures import client, database_url, migrated_database_url, session  # noqa: F401
