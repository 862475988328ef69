"""The API's request and response shapes (pydantic), kept apart from the tables in `service/models/`."""
