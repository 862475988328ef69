from tests.service.db_fixtures import (  # noqa: F401
    client,
    database_url,
    migrated_database_url,
    service_settings,
    session,
)
