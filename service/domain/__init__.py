"""What the service knows without a database: the closed vocabularies (vocabulary.py), how a project
measures (protocol.py), timing statistics (stats.py), the timing decision (timing.py) and change points
over a series (change_points.py). Imports nothing else of the service."""
